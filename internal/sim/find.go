package sim

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// FindConfig configures FindBackends.
type FindConfig struct {
	// SLO is the p99 TTFT objective.
	SLO time.Duration
	// TPOT, when set, is a p99 time-per-output-token objective as well
	// (FindXPYD).
	TPOT time.Duration
	// Max is the largest fleet tried (default 4,096).
	Max int
}

// Found is one policy's smallest fleet meeting the objective.
type Found struct {
	Policy string
	// Backends is the smallest fleet found to meet the SLO; 0 if even Max
	// did not.
	Backends int
	// TTFTP99 is the p99 TTFT with that fleet, or with Max when none met.
	TTFTP99 time.Duration
	// HitRate is the prompt-cache hit rate with that fleet.
	HitRate float64
	// Trials are the fleet sizes tried, in order.
	Trials []Trial
	// Floor is set when the search stopped because doubling the fleet no
	// longer lowered p99 TTFT: the objective is below what the workload's
	// own longest requests take on an idle server.
	Floor bool
}

// floorRatio: a doubling that leaves p99 above this fraction of what it
// was has not helped.
const floorRatio = 0.98

// Trial is one simulated fleet size.
type Trial struct {
	Backends int
	TTFTP99  time.Duration
	Errors   int
	Met      bool
}

// FindBackends finds, for every policy of cfg, the smallest number of
// servers whose p99 TTFT on cfg.Workload stays within fc.SLO with no errors:
// doubling from one server until the objective is met, then bisecting to the
// exact size, or giving up when two doublings in a row no longer lower p99
// (the objective is below the workload's floor). It assumes that more servers never make p99 TTFT worse, which
// holds for every policy here up to noise in the tie-breaks. cfg.Backends is
// ignored. trial, if not nil, is told of every size tried.
func FindBackends(ctx context.Context, cfg Config, fc FindConfig, trial func(policy string, backends int, p99 time.Duration, met bool)) ([]Found, error) {
	if fc.Max <= 0 {
		fc.Max = 4096
	}
	cfg.Backends = 1
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg.BoundsLimit = -1
	cfg.KeepRequests = -1
	var out []Found
	for _, policy := range cfg.Policies {
		f := Found{Policy: policy}
		try := func(n int) (bool, error) {
			c := cfg
			c.Backends = n
			run, _, err := simulate(ctx, c, policy, false)
			if err != nil {
				return false, err
			}
			s := run.Summary
			met := s.Errors == 0 && s.TTFTP99 <= fc.SLO
			f.Trials = append(f.Trials, Trial{Backends: n, TTFTP99: s.TTFTP99, Errors: s.Errors, Met: met})
			if trial != nil {
				trial(policy, n, s.TTFTP99, met)
			}
			if met && (f.Backends == 0 || n < f.Backends) {
				f.Backends, f.TTFTP99, f.HitRate = n, s.TTFTP99, s.HitRate
			}
			if f.Backends == 0 {
				f.TTFTP99, f.HitRate = s.TTFTP99, s.HitRate
			}
			return met, nil
		}
		lo, hi := 0, 0 // lo failed (0: none tried), hi met
		flat := 0      // doublings in a row that hardly lowered p99
		for n := 1; ; n = min(2*n, fc.Max) {
			met, err := try(n)
			if err != nil {
				return out, fmt.Errorf("%s with %d servers: %w", policy, n, err)
			}
			if met {
				hi = n
				break
			}
			lo = n
			if k := len(f.Trials); k >= 2 && f.Trials[k-1].Errors == 0 &&
				float64(f.Trials[k-1].TTFTP99) > floorRatio*float64(f.Trials[k-2].TTFTP99) {
				flat++
			} else {
				flat = 0
			}
			// p99 has stopped falling: it is the workload's own floor (its
			// longest prompts' prefill), which no fleet size lowers.
			if n == fc.Max || flat == 2 {
				f.Floor = flat == 2
				break
			}
		}
		for hi > 0 && hi-lo > 1 {
			mid := (lo + hi) / 2
			met, err := try(mid)
			if err != nil {
				return out, fmt.Errorf("%s with %d servers: %w", policy, mid, err)
			}
			if met {
				hi = mid
			} else {
				lo = mid
			}
		}
		out = append(out, f)
	}
	return out, nil
}

// WriteFindTable prints FindBackends' results, one policy a line.
func WriteFindTable(w io.Writer, found []Found, slo time.Duration) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "policy\tservers for p99 TTFT ≤ %v\tp99 TTFT there\thit rate there\tsizes tried\t\n", slo)
	for _, f := range found {
		n := fmt.Sprint(f.Backends)
		switch {
		case f.Backends == 0 && f.Floor:
			n = fmt.Sprintf("none (p99 floor %.0f ms)", float64(f.TTFTP99)/float64(time.Millisecond))
		case f.Backends == 0:
			n = fmt.Sprintf("> %d", f.Trials[len(f.Trials)-1].Backends)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f ms\t%.1f %%\t%d\t\n", f.Policy, n, float64(f.TTFTP99)/float64(time.Millisecond), 100*f.HitRate, len(f.Trials))
	}
	return tw.Flush()
}
