package kvroute

import (
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/routertest"
)

// A pruned pick in a fleet of 200 goes where the full scan goes: to the
// backend holding the prompt's prefix, and for a new prompt to an idle
// backend; it never picks outside the candidates it is given, even when
// the backend holding the prefix is not one; and the pruner's count of the
// requests in flight follows Route and Finish.
func TestPrunedPick(t *testing.T) {
	bs := routertest.Backends(200)
	// A clock that stands still: the prefill routed stays queued.
	now := time.Unix(1000, 0)
	r := newKVRouter(bs, Config{Seed: 1, Now: func() time.Time { return now }})
	p := r.Policy().(*Policy)
	if !p.cfg.pruning(len(bs)) {
		t.Fatal("200 backends are not pruned")
	}
	// Load every backend but a few, so that the idle ones are the least
	// loaded few among many.
	var open []*router.Ticket
	for i := range 190 {
		tk, err := r.Route(&router.Request{Prompt: routertest.Words(1000+i, 4000), MaxTokens: 10}, bs)
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

	doc := routertest.Words(1, 32<<10)
	holder := routertest.Route(t, r, &router.Request{Prompt: doc, MaxTokens: 10}, bs)
	holder.Finish(router.Outcome{Status: 200, PromptTokens: 8000, TTFT: time.Second, Latency: 2 * time.Second})
	again := routertest.Route(t, r, &router.Request{Prompt: doc + routertest.Words(2, 1000), MaxTokens: 10}, bs)
	if again.Backend != holder.Backend || again.Reason != "prefix" {
		t.Errorf("the prompt's continuation went to %s (%s), its prefix is on %s", again.Backend.Name, again.Reason, holder.Backend.Name)
	}
	open = append(open, again)

	fresh := routertest.Route(t, r, &router.Request{Prompt: routertest.Words(3, 4000), MaxTokens: 10}, bs)
	if n := fresh.Backend.Load().Requests; n != 1 {
		t.Errorf("a new prompt went to %s with %d in flight, with idle backends left", fresh.Backend.Name, n-1)
	}
	open = append(open, fresh)

	// Without the holder among the candidates, the pick stays among them.
	others := slices.DeleteFunc(slices.Clone(bs), func(b *fleet.Backend) bool { return b == holder.Backend })
	moved := routertest.Route(t, r, &router.Request{Prompt: doc + routertest.Words(4, 1000), MaxTokens: 10}, others)
	if moved.Backend == holder.Backend {
		t.Error("picked a backend that is not a candidate")
	}
	open = append(open, moved)

	for _, tk := range open {
		tk.Finish(router.Outcome{Status: 200, PromptTokens: 1000, TTFT: 100 * time.Millisecond, Latency: time.Second})
	}
	if got := p.prune.total; got != 0 {
		t.Errorf("pruner counts %d in flight after every request finished", got)
	}
}

// heldBy is a KVEvents whose engines all report exactly, one of them
// holding the whole of one prompt and nothing else held anywhere; as a
// KVHolders it names that backend for that prompt.
type heldBy struct {
	prompt  string
	backend int
	named   bool // Holders named it
}

func (h *heldBy) Match(req *router.Request, cands []*fleet.Backend, dst []router.KVState) {
	for i, b := range cands {
		dst[i] = router.KVState{Known: true, Exact: true}
		if req.Prompt == h.prompt && b.Index == h.backend {
			dst[i].Tokens = 4000
		}
	}
}

func (h *heldBy) Holders(req *router.Request, _ []*fleet.Backend, dst []int32, want int) []int32 {
	if req.Prompt == h.prompt && want > 0 && !slices.Contains(dst, int32(h.backend)) {
		h.named = true
		dst = append(dst, int32(h.backend))
	}
	return dst
}

// A pruned pick scores the backend whose engine's events say it holds the
// prompt even when the router's index does not know it (another replica
// placed it, or the index forgot it) and it is not among the least loaded:
// it goes there, as the full scan does.
func TestPrunedPickScoresEventHolders(t *testing.T) {
	for _, full := range []bool{false, true} {
		bs := routertest.Backends(200)
		now := time.Unix(1000, 0)
		doc := routertest.Words(7, 16<<10)
		ev := &heldBy{prompt: doc, backend: 137}
		r := newKVRouter(bs, Config{Seed: 1, Now: func() time.Time { return now }, Events: ev, FullScan: full})
		// One request in flight on every backend but 20, the holder among
		// the busy: the least loaded the pruned pick takes are others.
		var open []*fleet.Flight
		for i, b := range bs {
			if i < 20 {
				continue
			}
			open = append(open, b.Start(100, 100))
		}
		r.Policy().(*Policy).SetBackends(bs) // the pruner re-reads the loads
		got := routertest.Route(t, r, &router.Request{Prompt: doc, MaxTokens: 10}, bs)
		if got.Backend.Index != ev.backend {
			t.Errorf("full scan %v: went to %s (%s), the events say b%d holds the prompt", full, got.Backend.Name, got.Reason, ev.backend)
		}
		if !full && !ev.named {
			t.Error("the pruned pick did not ask the events for holders")
		}
		got.Finish(router.Outcome{Status: 200})
		for _, f := range open {
			f.Done()
		}
	}
}
