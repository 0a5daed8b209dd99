package sim

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/results"
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

// The report's prediction accuracy and goodput count every request, not
// only the sample of results a run keeps: a run that keeps 50 reports what
// one that keeps all of them does, and what the kept results say.
func TestSampledRunCountsEveryRequest(t *testing.T) {
	slo := results.SLO{TTFT: 200 * time.Millisecond, TPOT: 30 * time.Millisecond}
	cfg := Config{Workload: chatWorkload(t, 60), Backends: 3, Profile: profile(t), Policies: []string{"kvroute"},
		Seed: 3, KVEvents: true, SLO: slo, KeepRequests: -1}
	all, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.KeepRequests = 50
	sampled, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	a, s := all.Runs[0], sampled.Runs[0]
	if len(s.Requests) >= len(a.Requests) {
		t.Fatalf("kept %d of %d results", len(s.Requests), len(a.Requests))
	}
	want := results.Summarize("kvroute", a.Requests)
	want.ApplySLO(a.Requests, slo)
	acc := results.PredictionAccuracy(a.Requests, cfg.Profile.BlockSize)
	for name, got := range map[string]results.Summary{"all kept": a.Summary, "sampled": s.Summary} {
		if got.PredictionAccuracy != acc || acc == 0 {
			t.Errorf("%s: prediction accuracy %v, want %v", name, got.PredictionAccuracy, acc)
		}
		if got.SLO == nil || *got.SLO != *want.SLO || want.SLO.Met == 0 || want.SLO.Met == len(a.Requests) {
			t.Errorf("%s: SLO %+v, want %+v (some met, some not)", name, got.SLO, want.SLO)
		}
	}
}
