package sim

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/workload"
)

// TestDisaggRanking plays the mixed workload (short chats beside long
// documents) on six decode and two prefill servers in virtual time and
// ranks the splitters by the requests meeting a joint objective (TTFT ≤
// 2 s and time per output token ≤ 20 ms): kvroute's priced decision is
// never below a rule of thumb, and well above splitting everything or
// nothing.
func TestDisaggRanking(t *testing.T) {
	w, err := workload.Load("mixed", workload.Options{Rate: 42, Duration: 30 * time.Second, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"kvroute@priced"}
	for _, r := range router.SplitRules() {
		names = append(names, "kvroute@"+r)
	}
	rep, err := Run(context.Background(), Config{Workload: w, Backends: 8, Prefill: 2, Profile: profile(t), Seed: 1,
		Policies: names, SLO: results.SLO{TTFT: 2 * time.Second, TPOT: 20 * time.Millisecond}, BoundsLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	good := map[string]float64{}
	for _, run := range rep.Runs {
		if run.Summary.Errors != 0 {
			t.Errorf("%s: %d errors", run.Policy, run.Summary.Errors)
		}
		good[run.Policy] = run.Summary.SLO.GoodputRate
		t.Logf("%-16s %6.2f requests/s meeting the objective", run.Policy, run.Summary.SLO.GoodputRate)
	}
	priced := good["kvroute@priced"]
	for _, r := range router.SplitRules() {
		if g := good["kvroute@"+r]; priced < g {
			t.Errorf("priced %.2f requests/s below the rule %s's %.2f", priced, r, g)
		}
	}
	if priced < 1.5*good["kvroute@never"] || priced < 5*good["kvroute@always"] {
		t.Errorf("priced %.2f requests/s, want at least 1.5× never (%.2f) and 5× always (%.2f)", priced, good["kvroute@never"], good["kvroute@always"])
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
