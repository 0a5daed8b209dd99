package sim

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/shareddata/sharedtest"
	"github.com/kvroute/kvroute/internal/workload"
)

// TestDisaggRanking plays workloads on six decode and two prefill servers
// in virtual time, at a rate where kvroute's priced split still meets a
// joint objective on p99 TTFT and p99 time per output token, and checks
// that it does while every rule of thumb misses one bound or the other
// (docs/BENCHMARKS.md, Prefill/decode disaggregation).
func TestDisaggRanking(t *testing.T) {
	tests := []struct {
		name string
		load func(t *testing.T) workload.Workload
		ttft time.Duration
	}{
		{name: "mixed at 25/s", ttft: 5 * time.Second, load: func(t *testing.T) workload.Workload {
			w, err := workload.Load("mixed", workload.Options{Rate: 25, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			return w
		}},
		{name: "mooncake at 2x", ttft: 10 * time.Second, load: func(t *testing.T) workload.Workload {
			w, err := workload.Load("mooncake:"+sharedtest.Require(t, "mooncake/conversation_trace.jsonl"),
				workload.Options{Duration: 5 * time.Minute, Compress: 2, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			return w
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			slo := results.SLO{TTFT: tt.ttft, TPOT: 50 * time.Millisecond}
			names := []string{"kvroute@priced"}
			for _, r := range router.SplitRules() {
				names = append(names, "kvroute@"+r)
			}
			rep, err := Run(context.Background(), Config{Workload: tt.load(t), Backends: 8, Prefill: 2, Profile: profile(t), Seed: 1,
				Policies: names, SLO: slo, BoundsLimit: -1})
			if err != nil {
				t.Fatal(err)
			}
			for _, run := range rep.Runs {
				s := run.Summary
				meets := s.TTFTP99 <= slo.TTFT && s.ITLP99 <= slo.TPOT
				t.Logf("%-16s TTFT p99 %6.2f s, TPOT p99 %5.1f ms, meets %v", run.Policy, s.TTFTP99.Seconds(), float64(s.ITLP99)/1e6, meets)
				if s.Errors != 0 {
					t.Errorf("%s: %d errors", run.Policy, s.Errors)
				}
				if want := run.Policy == "kvroute@priced"; meets != want {
					t.Errorf("%s meets the objective: %v, want %v", run.Policy, meets, want)
				}
			}
		})
	}
}

func TestDisaggConfigErrors(t *testing.T) {
	w := chatWorkload(t, 4)
	for _, cfg := range []Config{
		{Workload: w, Backends: 2, Prefill: 2, Policies: []string{"kvroute@priced"}},
		{Workload: w, Backends: 2, Policies: []string{"kvroute@priced"}},
		{Workload: w, Backends: 3, Prefill: 1, Policies: []string{"kvroute@sometimes"}},
	} {
		cfg.Profile = profile(t)
		if _, err := Run(context.Background(), cfg); err == nil {
			t.Errorf("prefill %d of %d, %v: no error", cfg.Prefill, cfg.Backends, cfg.Policies)
		}
	}
}

// TestFindXPYD finds the smallest xPyD fleet for a workload and objective
// and checks it: the fleet found meets the objective, one decode server
// fewer with as many prefill servers does not, and no fleet tried with
// fewer servers in all met it.
func TestFindXPYD(t *testing.T) {
	w, err := workload.Load("chat-long", workload.Options{Rate: 8, Duration: 20 * time.Second, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	fc := FindConfig{SLO: 5 * time.Second, TPOT: 50 * time.Millisecond, Max: 16}
	found, err := FindXPYD(context.Background(), Config{Workload: w, Profile: profile(t), Seed: 1, Policies: []string{"kvroute@priced"}}, fc, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := found[0]
	t.Logf("%s: %dP%dD, TTFT p99 %v, TPOT p99 %v, %d fleets tried", f.Policy, f.Prefill, f.Decode, f.TTFTP99, f.TPOTP99, len(f.Trials))
	if f.Decode == 0 {
		t.Fatal("no fleet found")
	}
	if f.TTFTP99 > fc.SLO || f.TPOTP99 > fc.TPOT {
		t.Errorf("the fleet found misses the objective: %v, %v", f.TTFTP99, f.TPOTP99)
	}
	fewer := false
	for _, tr := range f.Trials {
		if tr.Met && tr.Prefill+tr.Decode < f.Prefill+f.Decode {
			t.Errorf("%dP%dD met the objective with fewer servers than %dP%dD", tr.Prefill, tr.Decode, f.Prefill, f.Decode)
		}
		if tr.Prefill == f.Prefill && tr.Decode == f.Decode-1 {
			fewer = true
			if tr.Met {
				t.Errorf("%dP%dD met the objective too", tr.Prefill, tr.Decode)
			}
		}
	}
	if f.Decode > 1 && !fewer {
		t.Errorf("%dP%dD was not tried", f.Prefill, f.Decode-1)
	}
}
