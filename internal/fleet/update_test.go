package fleet

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

func indexed(bs []*Backend) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = fmt.Sprintf("%s#%d", b.Name, b.Index)
	}
	return out
}

func TestUpdate(t *testing.T) {
	a := newFakeBackend(t, `{"data":[{"id":"m"}]}`, vllmMetrics)
	b := newFakeBackend(t, `{"data":[{"id":"m"}]}`, vllmMetrics)
	c := newFakeBackend(t, `{"data":[{"id":"m"}]}`, vllmMetrics)
	down := newFakeBackend(t, `{"data":[{"id":"m"}]}`, vllmMetrics)
	down.set(func(fb *fakeBackend) { fb.healthStatus = 503 })
	f, bs, _ := newTestFleet(t, Options{}, a, b)
	f.Refresh(t.Context())
	var watched [][]string
	f.Watch(func(bs []*Backend) { watched = append(watched, indexed(bs)) })

	// A request in flight on b0 when it is removed.
	flight := bs[0].Start(10, 20)

	// Same identity: nothing changes, the *Backend given is ignored.
	added, removed := f.Update(t.Context(), []*Backend{a.backend(t, 0, "b0"), b.backend(t, 1, "b1")})
	if added != nil || removed != nil || watched != nil {
		t.Fatalf("no-op update: added %v, removed %v, watched %v", indexed(added), indexed(removed), watched)
	}

	// Grow: c gets index 2, discovered and in rotation on return; down
	// gets index 3 and stays out.
	added, removed = f.Update(t.Context(), []*Backend{a.backend(t, 0, "b0"), b.backend(t, 1, "b1"),
		c.backend(t, 0, "c"), down.backend(t, 0, "down")})
	if got, want := indexed(added), []string{"c#2", "down#3"}; !slices.Equal(got, want) || removed != nil {
		t.Fatalf("grow: added %v, removed %v; want %v", got, indexed(removed), want)
	}
	if got, want := indexed(f.Candidates(nil, "m")), []string{"b0#0", "b1#1", "c#2"}; !slices.Equal(got, want) {
		t.Errorf("candidates after grow = %v, want %v", got, want)
	}
	if got := indexed(f.Backends()); len(got) != 4 {
		t.Errorf("backends after grow = %v", got)
	}

	// Shrink: b0 leaves at once, its flight finishes afterwards.
	added, removed = f.Update(t.Context(), []*Backend{b.backend(t, 1, "b1"), c.backend(t, 0, "c")})
	if got := indexed(removed); !slices.Equal(got, []string{"b0#0", "down#3"}) || added != nil {
		t.Fatalf("shrink: removed %v, added %v", got, indexed(added))
	}
	if got, want := indexed(f.Candidates(nil, "m")), []string{"b1#1", "c#2"}; !slices.Equal(got, want) {
		t.Errorf("candidates after shrink = %v, want %v", got, want)
	}
	if bs[0].Metrics(time.Now(), time.Hour) != nil {
		t.Error("a removed backend keeps its metrics")
	}
	f.Report(bs[0], Result{Kind: ResultGatewayError}) // ignored, no panic
	f.MarkFailed(bs[0], nil)
	flight.Done()
	if l := bs[0].Load(); l.Requests != 0 {
		t.Errorf("removed backend's load after its flight = %+v", l)
	}

	// Re-added: a new backend with a new index, starting cold.
	added, _ = f.Update(t.Context(), []*Backend{a.backend(t, 0, "b0"), b.backend(t, 1, "b1"), c.backend(t, 0, "c")})
	if got := indexed(added); !slices.Equal(got, []string{"b0#4"}) {
		t.Fatalf("re-added = %v, want b0#4", got)
	}
	if added[0] == bs[0] {
		t.Error("re-added backend reuses the removed *Backend")
	}
	want := [][]string{{"b0#0", "b1#1", "c#2", "down#3"}, {"b1#1", "c#2"}, {"b0#4", "b1#1", "c#2"}}
	if !slices.EqualFunc(watched, want, slices.Equal) {
		t.Errorf("watched %v, want %v", watched, want)
	}
}

// TestUpdateConcurrent races updates against the hot path and the loops; run
// with -race.
func TestUpdateConcurrent(t *testing.T) {
	fakes := []*fakeBackend{
		newFakeBackend(t, `{"data":[{"id":"m"}]}`, vllmMetrics),
		newFakeBackend(t, `{"data":[{"id":"m"}]}`, vllmMetrics),
		newFakeBackend(t, `{"data":[{"id":"m"}]}`, vllmMetrics),
	}
	f, _, _ := newTestFleet(t, Options{HealthInterval: time.Millisecond, ScrapeInterval: time.Millisecond}, fakes[0])
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Go(func() { _ = f.Run(ctx) })
	for range 4 {
		wg.Go(func() {
			var dst []*Backend
			for {
				select {
				case <-done:
					return
				default:
				}
				dst = f.Candidates(dst[:0], "m")
				for _, b := range dst {
					f.Report(b, Result{Kind: ResultGatewayError})
					f.Report(b, Result{Kind: ResultSuccess})
				}
				_ = f.Ready()
			}
		})
	}
	for i := range 50 {
		var want []*Backend
		for j, fb := range fakes {
			if (i>>j)&1 == 1 || j == 0 {
				want = append(want, fb.backend(t, 0, fmt.Sprintf("b%d", j)))
			}
		}
		f.Update(ctx, want)
	}
	close(done)
	f.Update(ctx, nil)
	if n := f.out.ejected.Load(); n != 0 {
		t.Errorf("ejected count with no backends = %d, want 0", n)
	}
	if f.Ready() || len(f.Backends()) != 0 {
		t.Error("an empty fleet is ready or has backends")
	}
	cancel()
	wg.Wait()
}
