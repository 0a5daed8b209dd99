package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/router/policies"
	"github.com/kvroute/kvroute/internal/sim"
)

// simDisagg is what the simulator's prefill/decode flags decide.
type simDisagg struct {
	splits string
}

func (d *simDisagg) register(fs *flag.FlagSet, cfg *sim.Config) {
	fs.IntVar(&cfg.Prefill, "prefill", 0, "how many of --backends are prefill servers (the rest decode; 0: an aggregated fleet)")
	fs.StringVar(&d.splits, "pd-split", policies.DefaultSplitter, "with --prefill: the splitters to compare, comma-separated, or all: "+strings.Join(policies.SplitterNames(), ", ")+"; each policy runs with each, named POLICY@SPLITTER")
	fs.Float64Var(&cfg.LinkBandwidth, "pd-link-bandwidth", sim.DefaultLinkBandwidth, "with --prefill: the KV transfer link's bytes/s between prefill and decode servers")
	fs.IntVar(&cfg.Split.Rules.MinTokens, "pd-min-tokens", 0, "with --prefill: the length and load splitters' threshold in tokens (0: their default, 1000)")
	fs.IntVar(&cfg.Split.Rules.MinUncached, "pd-min-uncached", 0, "with --prefill: the cache splitter's threshold of uncached tokens (0: its default, 128)")
	fs.IntVar(&cfg.Split.Rules.MaxQueue, "pd-max-queue", 0, "with --prefill: the load splitter's bound on the prefill server's requests (0: its default, 2)")
}

// apply names every run POLICY@SPLITTER when the fleet has prefill servers.
func (d *simDisagg) apply(cfg *sim.Config) error {
	if cfg.Prefill < 0 || cfg.Prefill >= cfg.Backends {
		return fmt.Errorf("--prefill must be from 0 to --backends - 1, got %d", cfg.Prefill)
	}
	if !(cfg.LinkBandwidth > 0) {
		return fmt.Errorf("--pd-link-bandwidth must be positive")
	}
	if cfg.Prefill == 0 {
		return nil
	}
	runs, err := withSplits(cfg.Policies, d.splits)
	cfg.Policies = runs
	return err
}

// withSplits names a run for each policy and each splitter of list
// (comma-separated, or all): POLICY@SPLITTER.
func withSplits(names []string, list string) ([]string, error) {
	splits := strings.Split(list, ",")
	if strings.TrimSpace(list) == "all" {
		splits = policies.SplitterNames()
	}
	var runs []string
	for _, p := range names {
		for _, sp := range splits {
			sp = strings.TrimSpace(sp)
			if _, err := policies.NewSplitter(sp, policies.SplitOptions{}); err != nil {
				return nil, fmt.Errorf("--pd-split: %w", err)
			}
			runs = append(runs, p+sim.SplitSep+sp)
		}
	}
	return runs, nil
}

// findPD runs --find-backends for a disaggregated fleet: per policy and
// splitter, the fewest prefill and decode servers (up to --prefill prefill
// servers) that meet the objectives.
func findPD(ctx context.Context, stdout, stderr io.Writer, cfg sim.Config, fc sim.FindConfig, started time.Time) int {
	fmt.Fprintf(stdout, "kvroute sim --find-backends: %s\n%s servers, up to %d prefill; p99 TTFT ≤ %v, p99 TPOT ≤ %v; policies %s\n\n",
		tiledDescription(cfg), cfg.Profile.Name, cfg.Prefill, fc.SLO, fc.TPOT, strings.Join(cfg.Policies, ", "))
	cfg.Progress = nil
	res, err := sim.FindXPYD(ctx, cfg, fc, cfg.Prefill, func(policy string, t sim.TrialPD) {
		mark := "✗"
		if t.Met {
			mark = "✓"
		}
		fmt.Fprintf(stderr, "  %-20s %8s: p99 TTFT %8.0f ms, TPOT %6.1f ms %s\n", policy, fmt.Sprintf("%dP%dD", t.Prefill, t.Decode),
			float64(t.TTFTP99)/float64(time.Millisecond), float64(t.TPOTP99)/float64(time.Millisecond), mark)
	})
	if err != nil {
		fmt.Fprintf(stderr, "kvroute sim: %v\n", err)
		return 1
	}
	if err := sim.WriteFindPDTable(stdout, res, fc); err != nil {
		fmt.Fprintf(stderr, "kvroute sim: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "\n(%v of wall time)\n", time.Since(started).Round(time.Millisecond))
	return 0
}
