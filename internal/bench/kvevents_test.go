package bench

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// TestBenchFollowsKVEvents plays a chat workload, one user at a time, on
// two emulators, with the router following their KV
// events over ZMQ and without: the report gives kvroute's share of
// requests whose cached tokens it predicted to the block (from the
// responses' X-Kvroute-Predicted-Cached against the usage the emulators
// report), and with the engines' own events that share is near all of them.
func TestBenchFollowsKVEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("plays a workload twice")
	}
	p, err := engine.LookupProfile(engine.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	p.NumGPUBlocks = 1000 // 16,000 tokens a server
	cfg := workload.DemoChat()
	cfg.Sessions, cfg.Span, cfg.Turns, cfg.Think = 8, 5*time.Second, 4, 2*time.Second
	w := workload.Workload{Name: "chat", Sessions: workload.Chat(cfg, 3)}
	accuracy := map[bool]float64{}
	for _, events := range []bool{false, true} {
		rep, err := RunBench(context.Background(), Config{
			Workload: w, Backends: 2, Profile: p, TimeScale: 0.1, Seed: 3, Users: 1,
			Policies: []string{"kvroute"}, KVEvents: events, Predictions: true,
			// The /tokenize calls wait as long as they take: the test
			// measures the matching, not its latency. With serve's 50 ms,
			// under the race detector at load 25, some timed out, the
			// prefix index decided those requests, and 0.375-0.75 were
			// predicted to the block; a 1 µs limit gives 0.156 every time.
			TokenizeTimeout: 10 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		s := rep.Runs[0].Summary
		t.Logf("events %v: %d requests, %d errors, hit rate %.3f, predicted to the block %.3f", events, s.Requests, s.Errors, s.HitRate, s.PredictionAccuracy)
		if s.Errors > 0 {
			t.Fatalf("events %v: %d errors", events, s.Errors)
		}
		accuracy[events] = s.PredictionAccuracy
	}
	if accuracy[false] <= 0 {
		t.Errorf("no prediction accuracy reported without events")
	}
	if accuracy[true] < 0.9 || accuracy[true] <= accuracy[false] {
		t.Errorf("with events %.3f of the requests were predicted to the block (without: %.3f); want at least 0.9 and more", accuracy[true], accuracy[false])
	}
}
