package sim

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// FoundPD is one policy's (POLICY@SPLITTER) smallest disaggregated fleet
// meeting the objective: Prefill prefill and Decode decode servers, 0 and
// 0 when none up to the largest tried did.
type FoundPD struct {
	Policy           string
	Prefill, Decode  int
	TTFTP99, TPOTP99 time.Duration
	Trials           []TrialPD
}

// TrialPD is one simulated xPyD fleet.
type TrialPD struct {
	Prefill, Decode  int
	TTFTP99, TPOTP99 time.Duration
	Errors           int
	Met              bool
}

// FindXPYD answers how many prefill and how many decode servers a
// workload needs: for every policy of cfg (each with its splitter), and
// for each number of prefill servers from 1 to maxPrefill, the fewest
// decode servers whose p99 TTFT meets fc.SLO and, when fc.TPOT is set,
// whose p99 time per output token meets fc.TPOT, with no errors (doubling
// from one, then bisecting, up to fc.Max servers in all, as FindBackends).
// It keeps the fleet with the fewest servers in all, then the fewest
// prefill servers, and stops adding prefill servers once that many alone
// reach the best total. trial, if not nil, is told of every fleet tried.
func FindXPYD(ctx context.Context, cfg Config, fc FindConfig, maxPrefill int, trial func(policy string, t TrialPD)) ([]FoundPD, error) {
	if fc.Max <= 0 {
		fc.Max = 4096
	}
	if maxPrefill < 1 {
		return nil, fmt.Errorf("sim: find xPyD with %d prefill servers at most", maxPrefill)
	}
	cfg.Backends, cfg.Prefill = 2, 1
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg.BoundsLimit, cfg.KeepRequests = -1, -1
	var out []FoundPD
	for _, policy := range cfg.Policies {
		f := FoundPD{Policy: policy}
		try := func(p, d int) (bool, error) {
			c := cfg
			c.Backends, c.Prefill = p+d, p
			run, _, err := simulate(ctx, c, policy, false)
			if err != nil {
				return false, fmt.Errorf("%s with %d prefill and %d decode servers: %w", policy, p, d, err)
			}
			s := run.Summary
			t := TrialPD{Prefill: p, Decode: d, TTFTP99: s.TTFTP99, TPOTP99: s.ITLP99, Errors: s.Errors}
			t.Met = s.Errors == 0 && s.TTFTP99 <= fc.SLO && (fc.TPOT <= 0 || s.ITLP99 <= fc.TPOT)
			f.Trials = append(f.Trials, t)
			if trial != nil {
				trial(policy, t)
			}
			if t.Met && (f.Decode == 0 || p+d < f.Prefill+f.Decode) {
				f.Prefill, f.Decode, f.TTFTP99, f.TPOTP99 = p, d, s.TTFTP99, s.ITLP99
			}
			return t.Met, nil
		}
		for p := 1; p <= maxPrefill && p < fc.Max; p++ {
			if f.Decode > 0 && p+1 >= f.Prefill+f.Decode {
				break // no fleet with this many prefill servers is smaller
			}
			most := fc.Max - p
			if f.Decode > 0 {
				most = min(most, f.Prefill+f.Decode-p-1) // only a smaller fleet counts
			}
			if most < 1 {
				break
			}
			lo, hi := 0, 0 // lo failed, hi met
			for d := 1; ; d = min(2*d, most) {
				met, err := try(p, d)
				if err != nil {
					return out, err
				}
				if met {
					hi = d
					break
				}
				lo = d
				if d == most {
					break
				}
			}
			for hi > 0 && hi-lo > 1 {
				mid := (lo + hi) / 2
				met, err := try(p, mid)
				if err != nil {
					return out, err
				}
				if met {
					hi = mid
				} else {
					lo = mid
				}
			}
		}
		out = append(out, f)
	}
	return out, nil
}

// WriteFindPDTable prints FindXPYD's results, one policy a line.
func WriteFindPDTable(w io.Writer, found []FoundPD, fc FindConfig) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "policy\tprefill\tdecode\tservers for p99 TTFT ≤ %v, TPOT ≤ %v\tp99 TTFT there\tp99 TPOT there\tfleets tried\t\n", fc.SLO, fc.TPOT)
	for _, f := range found {
		if f.Decode == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\tnone\t\t\t%d\t\n", f.Policy, len(f.Trials))
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f ms\t%.1f ms\t%d\t\n", f.Policy, f.Prefill, f.Decode, f.Prefill+f.Decode,
			float64(f.TTFTP99)/float64(time.Millisecond), float64(f.TPOTP99)/float64(time.Millisecond), len(f.Trials))
	}
	return tw.Flush()
}
