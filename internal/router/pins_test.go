package router

import (
	"fmt"
	"net/url"
	"runtime"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
)

func TestPinsForgetTheOldest(t *testing.T) {
	bs := backends(3)
	p := newPins(2)
	p.learn("resp_a", bs[0])
	p.learn("resp_b", bs[1])
	p.learn("resp_a", bs[2]) // learned again: moves, takes no room
	p.learn("resp_c", bs[1]) // full: resp_a, the oldest, goes
	tests := []struct {
		id         string
		want       int // index of the backend alone, or -1: all candidates
		wantPinned bool
	}{
		{"resp_a", -1, false},
		{"resp_b", 1, true},
		{"resp_c", 1, true},
		{"", -1, false},
	}
	for _, tt := range tests {
		got, pinned := p.narrow(tt.id, bs)
		if pinned != tt.wantPinned || (tt.want < 0) != (len(got) == 3) || tt.want >= 0 && (len(got) != 1 || got[0] != bs[tt.want]) {
			t.Errorf("narrow(%q) = %v, %v; want backend %d, pinned %v", tt.id, got, pinned, tt.want, tt.wantPinned)
		}
	}
	if n := p.entries(); n != 2 {
		t.Errorf("%d entries, want 2", n)
	}
	// The backend that holds it is not a candidate: all the others are.
	if got, pinned := p.narrow("resp_b", bs[2:]); pinned || len(got) != 1 || got[0] != bs[2] {
		t.Errorf("narrow without the pinned backend = %v, %v", got, pinned)
	}
	if u, g, pn := p.unknown.Load(), p.gone.Load(), p.pinned.Load(); u != 1 || g != 1 || pn != 2 {
		t.Errorf("unknown %d, gone %d, pinned %d; want 1, 1, 2", u, g, pn)
	}
	var none *pins
	none.learn("resp_a", bs[0])
	if got, pinned := none.narrow("resp_a", bs); pinned || len(got) != 3 {
		t.Error("nil pins pinned a request")
	}
}

// BenchmarkPins measures learning a response id and looking one up, as
// every Responses API request does, from many goroutines at once, with
// the pins full; and reports the heap an id takes.
func BenchmarkPins(b *testing.B) {
	bs := backends(8)
	ids := make([]string, DefaultResponsePins)
	for i := range ids {
		ids[i] = fmt.Sprintf("resp_%032x", i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	p := newPins(DefaultResponsePins)
	for i, id := range ids {
		p.learn(id, bs[i%8])
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perID := float64(after.HeapAlloc-before.HeapAlloc) / float64(len(ids))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			p.learn(ids[i%len(ids)], bs[i%8])
			pinSink, _ = p.narrow(ids[(i*7919)%len(ids)], bs)
		}
	})
	runtime.KeepAlive(p)
	b.ReportMetric(perID, "heap-B/id")
}

var pinSink []*fleet.Backend

// backends returns n backends serving model m (the policies' tests use
// routertest.Backends, which this package cannot import).
func backends(n int) []*fleet.Backend {
	bs := make([]*fleet.Backend, n)
	for i := range bs {
		u, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", 8001+i))
		bs[i] = fleet.NewBackend(i, fmt.Sprintf("b%d", i), u)
		bs[i].SetInfo(&fleet.Info{Models: []string{"m"}, BlockSize: 16, KVBlocks: 25_000})
	}
	return bs
}
