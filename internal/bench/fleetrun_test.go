package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

func startFleet(t *testing.T, policy string, backends int, scale float64) *Fleet {
	t.Helper()
	p, err := engine.LookupProfile(engine.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	f, err := StartFleet(context.Background(), FleetConfig{Backends: backends, Profile: p, TimeScale: scale, Policy: policy, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// End to end through the router: every later turn of a conversation lands on
// the backend of its first turn, and hits its cache there.
func TestConversationStaysOnItsBackend(t *testing.T) {
	// At a tenth of real time: a turn's prefill (a few milliseconds of
	// wall time even so) must stand out from the scheduling noise of a
	// loaded machine, which the router measures as queueing.
	const scale = 0.1
	f := startFleet(t, "kvroute", 4, scale)
	rng := rand.New(rand.NewPCG(1, 2))
	var sessions []workload.Session
	for i := range 8 {
		s := workload.Session{ID: fmt.Sprintf("s%d", i), System: workload.Text(rng, 4000)}
		for range 4 {
			s.Turns = append(s.Turns, workload.Turn{User: workload.Text(rng, 400), MaxTokens: 20})
		}
		sessions = append(sessions, s)
	}
	c := &Client{BaseURL: f.URL, Model: f.Model, TimeScale: scale}
	results := c.Run(context.Background(), sessions, nil)
	if len(results) != 32 {
		t.Fatalf("%d results, want 32", len(results))
	}
	first := map[int]string{}
	for _, r := range results {
		if r.Err != nil {
			t.Fatalf("session %d turn %d: %v", r.Session, r.Turn, r.Err)
		}
		if r.Turn == 0 {
			first[r.Session] = r.Backend
		}
	}
	used := map[string]bool{}
	for _, r := range results {
		used[r.Backend] = true
		if r.Turn == 0 {
			continue
		}
		if r.Backend != first[r.Session] || r.Route != "prefix" {
			t.Errorf("session %d turn %d on %s (%s), turn 0 on %s", r.Session, r.Turn, r.Backend, r.Route, first[r.Session])
		}
		if r.CachedTokens < r.PromptTokens/2 {
			t.Errorf("session %d turn %d: %d of %d prompt tokens cached", r.Session, r.Turn, r.CachedTokens, r.PromptTokens)
		}
	}
	if len(used) < 2 {
		t.Errorf("8 conversations all on %v: no spreading at low load", used)
	}
}

// A burst of requests sharing one long system prompt spreads over the fleet
// instead of piling onto the backend that cached it first.
func TestHotPrefixSpreadsWhenItsBackendSaturates(t *testing.T) {
	f := startFleet(t, "kvroute", 4, 0.01)
	rng := rand.New(rand.NewPCG(3, 4))
	system := workload.Text(rng, 40_000) // about 10k tokens
	var sessions []workload.Session
	for i := range 48 {
		sessions = append(sessions, workload.Session{ID: fmt.Sprintf("s%d", i), System: system,
			Turns: []workload.Turn{{User: workload.Text(rng, 200), MaxTokens: 50}}})
	}
	c := &Client{BaseURL: f.URL, Model: f.Model, TimeScale: 0.01}
	var mu sync.Mutex
	per := map[string]int{}
	results := c.Run(context.Background(), sessions, func(r Result) {
		mu.Lock()
		per[r.Backend]++
		mu.Unlock()
	})
	cached := 0
	for _, r := range results {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		cached += r.CachedTokens
	}
	if len(per) < 2 {
		t.Fatalf("48 simultaneous requests with one hot prefix all went to %v", per)
	}
	for b, n := range per {
		if n > 36 {
			t.Errorf("%s took %d of 48: hot spot (%v)", b, n, per)
		}
	}
	// Spreading must not throw the cache away: the prefix is prefilled on
	// few backends and reused by most requests.
	if s := Summarize("", results); s.HitRate < 0.6 {
		t.Errorf("hit rate %.2f with one shared 10k-token prefix, want > 0.6 (%v)", s.HitRate, per)
	}
}
