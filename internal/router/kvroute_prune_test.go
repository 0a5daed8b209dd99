package router

import (
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// A pruned pick in a fleet of 200 goes where the full scan goes: to the
// backend holding the prompt's prefix, and for a new prompt to an idle
// backend; it never picks outside the candidates it is given, even when
// the backend holding the prefix is not one; and the pruner's count of the
// requests in flight follows Route and Finish.
func TestPrunedPick(t *testing.T) {
	bs := backends(200)
	// A clock that stands still: the prefill routed stays queued.
	now := time.Unix(1000, 0)
	r := newKVRouter(bs, KVRouteConfig{Seed: 1, Now: func() time.Time { return now }})
	p := r.Policy().(*KVRoute)
	if !p.cfg.pruning(len(bs)) {
		t.Fatal("200 backends are not pruned")
	}
	// Load every backend but a few, so that the idle ones are the least
	// loaded few among many.
	var open []*Ticket
	for i := range 190 {
		tk, err := r.Route(&Request{Prompt: words(1000+i, 4000), MaxTokens: 10}, bs)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, tk)
	}
	idle := 0
	for _, b := range bs {
		if b.Load().Requests == 0 {
			idle++
		}
	}
	if idle == 0 || idle > 20 {
		t.Fatalf("%d idle backends of 200 after 190 requests", idle)
	}
	if got, want := p.prune.total, int64(190); got != want {
		t.Errorf("pruner counts %d in flight, want %d", got, want)
	}

	doc := words(1, 32<<10)
	holder := route(t, r, &Request{Prompt: doc, MaxTokens: 10}, bs)
	holder.Finish(Outcome{Status: 200, PromptTokens: 8000, TTFT: time.Second, Latency: 2 * time.Second})
	again := route(t, r, &Request{Prompt: doc + words(2, 1000), MaxTokens: 10}, bs)
	if again.Backend != holder.Backend || again.Reason != "prefix" {
		t.Errorf("the prompt's continuation went to %s (%s), its prefix is on %s", again.Backend.Name, again.Reason, holder.Backend.Name)
	}
	open = append(open, again)

	fresh := route(t, r, &Request{Prompt: words(3, 4000), MaxTokens: 10}, bs)
	if n := fresh.Backend.Load().Requests; n != 1 {
		t.Errorf("a new prompt went to %s with %d in flight, with idle backends left", fresh.Backend.Name, n-1)
	}
	open = append(open, fresh)

	// Without the holder among the candidates, the pick stays among them.
	others := slices.DeleteFunc(slices.Clone(bs), func(b *fleet.Backend) bool { return b == holder.Backend })
	moved := route(t, r, &Request{Prompt: doc + words(4, 1000), MaxTokens: 10}, others)
	if moved.Backend == holder.Backend {
		t.Error("picked a backend that is not a candidate")
	}
	open = append(open, moved)

	for _, tk := range open {
		tk.Finish(Outcome{Status: 200, PromptTokens: 1000, TTFT: 100 * time.Millisecond, Latency: time.Second})
	}
	if got := p.prune.total; got != 0 {
		t.Errorf("pruner counts %d in flight after every request finished", got)
	}
}
