package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
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
