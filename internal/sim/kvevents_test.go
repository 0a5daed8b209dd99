package sim

import (
	"context"
	"reflect"
	"testing"
	"time"
)

// With the servers' KV events kvroute knows, to the block, what the server
// it picks has cached; without them it guesses. (Under heavier eviction a
// few percent of requests find a block evicted, or stored by a request
// ahead of them, between the pick and their admission.) Both runs are
// deterministic.
func TestKVEventsPredictToTheBlock(t *testing.T) {
	p := profile(t)
	p.NumGPUBlocks = 8000 // 128k tokens a server
	accuracy := func(events bool, delay time.Duration) float64 {
		cfg := Config{Workload: chatWorkload(t, 60), Backends: 3, Profile: p, Policies: []string{"kvroute"},
			Seed: 3, KVEvents: events, KVEventDelay: delay}
		rep, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(rep.Runs[0].Requests, again.Runs[0].Requests) {
			t.Fatalf("events %v: two runs differ", events)
		}
		return rep.Runs[0].Summary.PredictionAccuracy
	}
	without := accuracy(false, 0)
	with := accuracy(true, time.Millisecond)
	if with < 0.99 || with <= without {
		t.Fatalf("predicted to the block: %.3f with events, %.3f without; want ≥ 0.99 and better", with, without)
	}
	t.Logf("predicted to the block: %.3f with events, %.3f without", with, without)
}
