package results

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// SLO is a joint service-level objective: a request meets it when it
// succeeded, its TTFT is at most TTFT and its mean time per output token
// (Result.ITL) at most TPOT. Goodput, as the disaggregation literature
// (DistServe) defines it, is the requests that meet both. A zero bound is
// no bound.
type SLO struct {
	TTFT time.Duration `json:"ttft_ns"`
	TPOT time.Duration `json:"tpot_ns"`
}

// IsZero reports whether s bounds nothing.
func (s SLO) IsZero() bool { return s.TTFT <= 0 && s.TPOT <= 0 }

// String is the --goodput form, ttft=X,tpot=Y.
func (s SLO) String() string {
	var parts []string
	if s.TTFT > 0 {
		parts = append(parts, "ttft="+s.TTFT.String())
	}
	if s.TPOT > 0 {
		parts = append(parts, "tpot="+s.TPOT.String())
	}
	return strings.Join(parts, ",")
}

// ParseSLO reads the --goodput form: ttft=DURATION,tpot=DURATION, either
// or both.
func ParseSLO(v string) (SLO, error) {
	var s SLO
	for _, part := range strings.Split(v, ",") {
		key, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		d, err := time.ParseDuration(val)
		switch {
		case !ok || err != nil || d <= 0:
			return SLO{}, fmt.Errorf("bad objective %q: want ttft=DURATION,tpot=DURATION (e.g. ttft=2s,tpot=50ms)", part)
		case key == "ttft":
			s.TTFT = d
		case key == "tpot":
			s.TPOT = d
		default:
			return SLO{}, fmt.Errorf("bad objective %q: the bounds are ttft and tpot", part)
		}
	}
	if s.IsZero() {
		return s, errors.New("empty objective")
	}
	return s, nil
}

// SLOSummary is how a run did against a joint objective.
type SLOSummary struct {
	SLO
	// Met counts the requests that met it; Goodput is their fraction of
	// all requests sent (failed ones count as missed), GoodputRate their
	// number per second of the run's span.
	Met         int     `json:"met"`
	Goodput     float64 `json:"goodput"`
	GoodputRate float64 `json:"goodput_per_s"`
	// TTFTMissed and TPOTMissed are the fractions of requests sent that
	// succeeded over the TTFT bound and over the TPOT bound (a request may
	// miss both); Rejected the fraction that failed.
	TTFTMissed float64 `json:"ttft_missed"`
	TPOTMissed float64 `json:"tpot_missed"`
	Rejected   float64 `json:"rejected"`
}

// Meets reports whether r met the objective.
func (s SLO) Meets(r *Result) bool {
	return r.Err == nil && r.Error == "" && (s.TTFT <= 0 || r.TTFT <= s.TTFT) && (s.TPOT <= 0 || r.ITL <= s.TPOT)
}

// ApplySLO sets sum.SLO: how the requests results did against slo (nothing
// for a zero objective).
func (sum *Summary) ApplySLO(results []Result, slo SLO) {
	if slo.IsZero() {
		return
	}
	var c sloCount
	for i := range results {
		c.add(slo, &results[i])
	}
	sum.SLO = c.summary(slo, sum.Span)
}

// sloCount counts requests against an objective one at a time, so that a
// Summarizer gives the same SLOSummary as ApplySLO without the results.
type sloCount struct {
	n, met, ttft, tpot, failed int
}

func (c *sloCount) add(slo SLO, r *Result) {
	c.n++
	switch {
	case r.Err != nil || r.Error != "":
		c.failed++
		return
	case slo.Meets(r):
		c.met++
	}
	if slo.TTFT > 0 && r.TTFT > slo.TTFT {
		c.ttft++
	}
	if slo.TPOT > 0 && r.ITL > slo.TPOT {
		c.tpot++
	}
}

// summary returns the counts as fractions of the requests, and the goodput
// per second of span; nil for a zero objective.
func (c *sloCount) summary(slo SLO, span time.Duration) *SLOSummary {
	if slo.IsZero() {
		return nil
	}
	out := &SLOSummary{SLO: slo, Met: c.met}
	if n := float64(c.n); n > 0 {
		out.Goodput = float64(c.met) / n
		out.TTFTMissed, out.TPOTMissed, out.Rejected = float64(c.ttft)/n, float64(c.tpot)/n, float64(c.failed)/n
	}
	if span > 0 {
		out.GoodputRate = float64(c.met) / span.Seconds()
	}
	return out
}
