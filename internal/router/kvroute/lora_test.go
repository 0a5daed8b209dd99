package kvroute

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/routertest"
)

func TestHarmonic(t *testing.T) {
	for n, want := range map[int]float64{0: 0, 1: 1, 2: 1.5, 4: 25.0 / 12} {
		if got := harmonic(n); math.Abs(got-want) > 1e-12 {
			t.Errorf("harmonic(%d) = %v, want %v", n, got, want)
		}
	}
}

// The adapter term: nothing where the adapter has requests in flight, a
// load where it has not been used among the last max_loras adapters, and a
// wait for a slot where max_loras others are in flight.
func TestAdapterWait(t *testing.T) {
	const life = 2.0
	load := DefaultAdapterLoad.Seconds()
	metrics := map[*fleet.Backend]*fleet.Metrics{}
	bs := routertest.Backends(1)
	b := bs[0]
	p := New(bs, Config{Seed: 1, Now: frozenClock, Metrics: func(b *fleet.Backend) *fleet.Metrics { return metrics[b] }})
	check := func(name, adapter string, wantLoad, wantSlot float64) {
		t.Helper()
		l, s, _ := p.adapterWait(b, adapter, life)
		if math.Abs(l-wantLoad) > 1e-9 || math.Abs(s-wantSlot) > 1e-9 {
			t.Errorf("%s: load %v, slot %v; want %v, %v", name, l, s, wantLoad, wantSlot)
		}
	}
	check("base model", "", 0, 0)
	check("never used, one slot free", "a", load, 0)
	releaseA := p.adapters.routed(0, "a", true)
	check("in flight", "a", 0, 0)
	// One slot (vLLM's default) and a in flight: b waits for a's request.
	check("slot busy", "b", load, life*harmonic(1))
	p.adapters.routed(0, "a", false)
	check("slot busy with two requests", "b", load, life*harmonic(2))
	// With max_lora 2 scraped, b gets the free slot.
	metrics[b] = &fleet.Metrics{LoRA: &fleet.LoRAInfo{MaxLoRAs: 2}, At: frozenClock()}
	check("second slot free", "b", load, 0)
	releaseA()
	releaseB := p.adapters.routed(0, "b", true)
	releaseB()
	// a and b both used lately, one request of a still in flight: b is in a
	// GPU slot (no load), and a slot is free.
	check("resident", "b", 0, 0)
}

// A request for an adapter goes to the backend running it rather than to an
// idle one that would have to load it.
func TestAdapterAffinity(t *testing.T) {
	bs := routertest.Backends(2)
	for _, b := range bs {
		b.SetInfo(&fleet.Info{Models: []string{"m", "sql"}, Adapters: []string{"sql"}, BlockSize: 16, KVBlocks: 25_000})
	}
	r := router.NewRouter(New(bs, Config{Seed: 1, Now: frozenClock}), router.NewTokens())
	first := routertest.Route(t, r, &router.Request{Model: "sql", Prompt: routertest.Words(1, 400), MaxTokens: 50}, bs)
	if first.Backend == nil {
		t.Fatal("no backend")
	}
	for i := range 3 {
		tk := routertest.Route(t, r, &router.Request{Model: "sql", Prompt: routertest.Words(10+i, 400), MaxTokens: 50}, bs)
		if tk.Backend != first.Backend {
			t.Errorf("request %d for the adapter went to %s, not to %s which runs it", i, tk.Backend.Name, first.Backend.Name)
		}
		tk.Finish(router.Outcome{Status: 200, PromptTokens: -1, CachedTokens: -1, CompletionTokens: -1, TTFT: 10 * time.Millisecond, Latency: time.Second})
	}
	first.Finish(router.Outcome{Status: 200, PromptTokens: -1, CachedTokens: -1, CompletionTokens: -1, TTFT: 10 * time.Millisecond, Latency: time.Second})
}
