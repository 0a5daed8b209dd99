package sim

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// On 20 adapters over 4 servers with 4 adapter slots each, kvroute keeps
// each adapter where it is loaded: it loads adapters at most half as often
// as least-request, which spreads every adapter everywhere, and llm-d's
// lora-affinity profile; and its TTFT p99 is lower than both.
func TestLoRAKvrouteLoadsFewerAdapters(t *testing.T) {
	w, err := workload.Load("lora:20", workload.Options{Duration: 40 * time.Second, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	p := profile(t)
	l := engine.DefaultLoRA(p)
	l.MaxLoRAs, l.MaxCPULoRAs = 4, 4
	cfg := Config{Workload: w, Backends: 4, Profile: p, LoRA: &l, Seed: 3,
		Policies: []string{"kvroute", "least-request", "llmd-lora"}}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	kv, lr, llmd := rep.Runs[0].Summary, rep.Runs[1].Summary, rep.Runs[2].Summary
	for _, s := range []struct {
		name  string
		loads int64
		p99   time.Duration
	}{{"kvroute", kv.AdapterLoads, kv.TTFTP99}, {"least-request", lr.AdapterLoads, lr.TTFTP99}, {"llmd-lora", llmd.AdapterLoads, llmd.TTFTP99}} {
		t.Logf("%-13s %4d adapter loads, TTFT p99 %v", s.name, s.loads, s.p99)
	}
	if kv.Errors+lr.Errors+llmd.Errors > 0 {
		t.Fatalf("errors: %d, %d, %d", kv.Errors, lr.Errors, llmd.Errors)
	}
	if kv.AdapterLoads == 0 || 2*kv.AdapterLoads > lr.AdapterLoads {
		t.Errorf("kvroute loaded %d adapters, least-request %d: want at most half", kv.AdapterLoads, lr.AdapterLoads)
	}
	if kv.AdapterLoads > llmd.AdapterLoads {
		t.Errorf("kvroute loaded %d adapters, llmd-lora %d: want no more", kv.AdapterLoads, llmd.AdapterLoads)
	}
	if kv.TTFTP99 >= lr.TTFTP99 || kv.TTFTP99 >= llmd.TTFTP99 {
		t.Errorf("kvroute's TTFT p99 %v, least-request's %v, llmd-lora's %v: want kvroute's lowest", kv.TTFTP99, lr.TTFTP99, llmd.TTFTP99)
	}
}

// A workload naming adapters needs the servers' LoRA limits.
func TestLoRAWorkloadNeedsLimits(t *testing.T) {
	w, err := workload.Load("lora:5", workload.Options{Duration: 5 * time.Second, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), Config{Workload: w, Backends: 2, Profile: profile(t), Policies: []string{"kvroute"}})
	if err == nil {
		t.Fatal("a LoRA workload ran on servers without LoRA")
	}
}
