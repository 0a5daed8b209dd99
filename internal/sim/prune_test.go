package sim

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/shareddata/sharedtest"
	"github.com/kvroute/kvroute/internal/workload"
)

// kvroute's pruned pick (the prefix holders, the session's server and the
// least loaded, not every server) decides as the full scan does, within a
// point: on chat at fleet capacity and on the Mooncake excerpt tiled to
// the fleet, at 96 servers (pruning starts above 64), the hit rate is no
// more than a percentage point lower (and no more than two higher: on chat
// the pruned pick measured 77.9 % against 76.8 %, its tie-breaks among the
// least loaded keeping conversations slightly better; with the e2e
// objective, 79.2 % against 79.3 %), and TTFT p50 and p99
// differ by less than 5 %. On Mooncake, the means of three seeds: with the
// default objective (e2e, which prices the stream) one seed's TTFT p50 moves
// by as much as 9 % from seed to seed, pruned or not (seed 9: 391 ms pruned,
// 367 ms full; seed 1: 389 against 400 ms); the means differ by 2 %.
func TestPrunedPickMatchesFullScan(t *testing.T) {
	if testing.Short() {
		t.Skip("two fleets of 96 servers, each twice")
	}
	const servers = 96
	chat := Config{Workload: chatWorkload(t, 15*servers), Backends: servers, Profile: profile(t),
		Policies: []string{"kvroute"}}
	w, err := workload.Load("mooncake:"+sharedtest.Require(t, "mooncake/conversation_trace.jsonl"),
		workload.Options{Duration: 90 * time.Second, Compress: 2})
	if err != nil {
		t.Fatal(err)
	}
	mooncake := Config{Workload: w, Backends: servers, Tile: servers / 8, Profile: profile(t).WithBlockSize(512),
		Policies: []string{"kvroute"}}
	for _, tt := range []struct {
		name  string
		cfg   Config
		seeds []uint64
	}{{"chat", chat, []uint64{5}}, {"mooncake", mooncake, []uint64{9, 1, 2}}} {
		t.Run(tt.name, func(t *testing.T) {
			pruned := meanSummary(t, tt.cfg, tt.seeds)
			tt.cfg.FullScan = true
			full := meanSummary(t, tt.cfg, tt.seeds)
			t.Logf("pruned: hit rate %.2f %%, TTFT p50 %v, p99 %v; full scan: %.2f %%, %v, %v",
				100*pruned.HitRate, pruned.TTFTP50, pruned.TTFTP99, 100*full.HitRate, full.TTFTP50, full.TTFTP99)
			if d := pruned.HitRate - full.HitRate; d < -0.01 || d > 0.02 {
				t.Errorf("hit rate %.2f %% pruned, %.2f %% full", 100*pruned.HitRate, 100*full.HitRate)
			}
			for _, q := range []struct {
				name      string
				got, want time.Duration
			}{{"p50", pruned.TTFTP50, full.TTFTP50}, {"p99", pruned.TTFTP99, full.TTFTP99}} {
				if math.Abs(float64(q.got-q.want)) > 0.05*float64(q.want) {
					t.Errorf("TTFT %s %v pruned, %v full", q.name, q.got, q.want)
				}
			}
			if pruned.Errors != full.Errors {
				t.Errorf("errors: %d pruned, %d full", pruned.Errors, full.Errors)
			}
		})
	}
}

// meanSummary runs cfg with each seed and returns the mean hit rate and
// TTFT percentiles, and the errors summed.
func meanSummary(t *testing.T, cfg Config, seeds []uint64) results.Summary {
	t.Helper()
	var m results.Summary
	for _, seed := range seeds {
		cfg.Seed = seed
		s := summary(t, cfg)
		m.HitRate += s.HitRate / float64(len(seeds))
		m.TTFTP50 += s.TTFTP50 / time.Duration(len(seeds))
		m.TTFTP99 += s.TTFTP99 / time.Duration(len(seeds))
		m.Errors += s.Errors
	}
	return m
}

func summary(t *testing.T, cfg Config) results.Summary {
	t.Helper()
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rep.Runs[0].Summary
}
