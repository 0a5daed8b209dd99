package results

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Summary is the aggregate of a run, in model time.
type Summary struct {
	// Name labels the run (the policy).
	Name string `json:"name"`
	// Requests and Errors count what was sent and what failed.
	Requests int `json:"requests"`
	Errors   int `json:"errors"`
	// TTFT, end-to-end and inter-token latency percentiles over successful
	// requests (ITL: of each request's mean).
	TTFTP50 time.Duration `json:"ttft_p50_ns"`
	TTFTP99 time.Duration `json:"ttft_p99_ns"`
	E2EP50  time.Duration `json:"e2e_p50_ns"`
	E2EP99  time.Duration `json:"e2e_p99_ns"`
	ITLP50  time.Duration `json:"itl_p50_ns"`
	ITLP99  time.Duration `json:"itl_p99_ns"`
	// ServerTTFTP50 and ServerTTFTP99 are the TTFTs the backends measured
	// (emulators and llama-server; 0 otherwise): the same as TTFT less the
	// client's, the router's and the machine's wall-clock overheads (and,
	// for llama-server, less the wait for a free slot).
	ServerTTFTP50 time.Duration `json:"server_ttft_p50_ns,omitempty"`
	ServerTTFTP99 time.Duration `json:"server_ttft_p99_ns,omitempty"`
	// Span is the time from the first request sent to the last finished.
	Span time.Duration `json:"span_ns"`
	// OutputTokensPerSec is completion tokens over Span.
	OutputTokensPerSec float64 `json:"output_tokens_per_s"`
	// PromptTokens and CachedTokens sum the responses' usage; HitRate is
	// their ratio.
	PromptTokens     int     `json:"prompt_tokens"`
	CachedTokens     int     `json:"cached_tokens"`
	CompletionTokens int     `json:"completion_tokens"`
	HitRate          float64 `json:"hit_rate"`
	// Lost, CutWithEvent and CutSilent count the failed requests by how
	// they failed (see Result); they add up to Errors.
	Lost         int `json:"lost"`
	CutWithEvent int `json:"cut_with_event"`
	CutSilent    int `json:"cut_silent"`
	// FaultRequests counts the requests sent while a fault was in force;
	// FaultTTFTP99 is the p99 TTFT of those among them that succeeded. Both
	// are 0 for a run without faults.
	FaultRequests int           `json:"fault_requests,omitempty"`
	FaultTTFTP99  time.Duration `json:"fault_ttft_p99_ns,omitempty"`
	// Migrated counts the streams a fault cut that completed all the same
	// (Result.Migrated), MigratedStalled those of them cut by a stall;
	// MigrationGapP50 and MigrationGapP99 are the percentiles of the
	// cut-to-continuation gaps (Result.MaxGap) of the others (killed or cut
	// backends), StallGapP50 and StallGapP99 of the stalled ones.
	Migrated        int           `json:"migrated,omitempty"`
	MigratedStalled int           `json:"migrated_stalled,omitempty"`
	MigrationGapP50 time.Duration `json:"migration_gap_p50_ns,omitempty"`
	MigrationGapP99 time.Duration `json:"migration_gap_p99_ns,omitempty"`
	StallGapP50     time.Duration `json:"stall_gap_p50_ns,omitempty"`
	StallGapP99     time.Duration `json:"stall_gap_p99_ns,omitempty"`
	// TextChecked and TextWrong count the completed replies whose text was
	// checked against the emulators' and those that differed.
	TextChecked int `json:"text_checked,omitempty"`
	TextWrong   int `json:"text_wrong,omitempty"`
	// RouterMigrations are kvroute's own count of its migrations by outcome
	// (kvroute_migrations_total), for a run behind kvroute; nil otherwise.
	RouterMigrations map[string]int `json:"router_migrations,omitempty"`
	// Imbalance is the busiest backend's busy time over the mean (1 is
	// perfectly even); 0 when unknown.
	Imbalance float64 `json:"imbalance"`
	// AdapterLoads counts the LoRA adapters the backends loaded from
	// storage (0 without adapters).
	AdapterLoads int64 `json:"adapter_loads,omitempty"`
	// PredictionAccuracy is the share of successful requests whose
	// predicted cached tokens were right to the block
	// (PredictionAccuracy); 0 when not measured.
	PredictionAccuracy float64 `json:"prediction_accuracy,omitempty"`
	// TTFTError is the median absolute percentage error of the predicted
	// TTFT (0.1 is 10 %) and TTFTCoverage the share of requests whose TTFT
	// fell inside the predicted interval, both over the successful requests
	// past the first PredictionWarmUp with a prediction; 0 for policies that
	// do not predict.
	TTFTError    float64 `json:"ttft_prediction_error,omitempty"`
	TTFTCoverage float64 `json:"ttft_interval_coverage,omitempty"`
	// ITLError is the same median error for the predicted mean time
	// between a stream's tokens, over the streams of two tokens or more; 0
	// for policies that do not predict it.
	ITLError float64 `json:"itl_prediction_error,omitempty"`
	// SLO is how the run did against the joint objective of the run
	// (ApplySLO); nil without one.
	SLO *SLOSummary `json:"slo,omitempty"`
}

// PredictionAccuracy returns the share of the successful requests whose
// PredictedCached falls in the same block of blockSize tokens as the
// CachedTokens their backend reported: how often the policy knew, to the
// block, what the chosen backend had cached.
func PredictionAccuracy(rs []Result, blockSize int) float64 {
	var c predictionCount
	for i := range rs {
		c.add(blockSize, &rs[i])
	}
	return c.share()
}

// predictionCount counts successful requests and those predicted to the
// block, one at a time (PredictionAccuracy).
type predictionCount struct{ ok, right int }

func (c *predictionCount) add(blockSize int, r *Result) {
	if blockSize <= 0 || r.Status != 200 {
		return
	}
	c.ok++
	if r.PredictedCached/blockSize == r.CachedTokens/blockSize {
		c.right++
	}
}

func (c *predictionCount) share() float64 {
	if c.ok == 0 {
		return 0
	}
	return float64(c.right) / float64(c.ok)
}

// Summarize aggregates results.
func Summarize(name string, results []Result) Summary {
	var a Summarizer
	for i := range results {
		a.Add(&results[i])
	}
	return a.Summary(name)
}

// Summarizer aggregates results one at a time, in memory that does not grow
// with their number beyond ExactLimit (see Latencies): a simulation of ten
// million requests summarises them as they end instead of keeping them. The
// zero value is ready to use. Not safe for concurrent use.
type Summarizer struct {
	// BlockSize, when positive, makes the Summary's PredictionAccuracy
	// that of every result added, to blocks of BlockSize tokens; SLO, when
	// not zero, its SLO (as ApplySLO). Set them before the first Add.
	BlockSize int
	SLO       SLO

	s                                 Summary
	ttft, e2e, itl, server, faultTTFT Latencies
	migrationGap, stallGap            Latencies
	first, last                       time.Duration
	seen                              bool
	predicted                         predictionCount
	ttftPredicted, itlPredicted       prediction
	slo                               sloCount
}

// Add counts r.
func (a *Summarizer) Add(r *Result) {
	s := &a.s
	s.Requests++
	a.predicted.add(a.BlockSize, r)
	if r.Status == 200 {
		a.ttftPredicted.add(r.PredictedTTFT, r.TTFT, r.PredictedTTFTLow, r.PredictedTTFTHigh)
		a.itlPredicted.add(r.PredictedITL, r.ITL, 0, 0)
	}
	if !a.SLO.IsZero() {
		a.slo.add(a.SLO, r)
	}
	if !a.seen || r.Sent < a.first {
		a.first, a.seen = r.Sent, true
	}
	a.last = max(a.last, r.Sent+r.E2E)
	if r.InFault {
		s.FaultRequests++
	}
	if r.Err != nil || r.Error != "" {
		s.Errors++
		switch {
		case r.CutWithEvent:
			s.CutWithEvent++
		case r.CutSilent:
			s.CutSilent++
		default:
			// Unclassified failures (results written before the
			// classification existed) count as lost: no usable answer.
			s.Lost++
		}
		return
	}
	a.ttft.Add(r.TTFT)
	if r.InFault {
		a.faultTTFT.Add(r.TTFT)
	}
	switch {
	case r.Migrated && r.CutBy == "stall":
		s.Migrated++
		s.MigratedStalled++
		a.stallGap.Add(r.MaxGap)
	case r.Migrated:
		s.Migrated++
		a.migrationGap.Add(r.MaxGap)
	}
	if r.TextWrong {
		s.TextWrong++
	}
	a.e2e.Add(r.E2E)
	if r.ITL > 0 {
		a.itl.Add(r.ITL)
	}
	if r.ServerTTFT > 0 {
		a.server.Add(r.ServerTTFT)
	}
	s.PromptTokens += r.PromptTokens
	s.CachedTokens += r.CachedTokens
	s.CompletionTokens += r.CompletionTokens
}

// Summary returns the aggregate of the results added so far, named name.
func (a *Summarizer) Summary(name string) Summary {
	s := a.s
	s.Name = name
	s.TTFTP50, s.TTFTP99 = a.ttft.Quantile(0.50), a.ttft.Quantile(0.99)
	s.E2EP50, s.E2EP99 = a.e2e.Quantile(0.50), a.e2e.Quantile(0.99)
	s.ITLP50, s.ITLP99 = a.itl.Quantile(0.50), a.itl.Quantile(0.99)
	s.ServerTTFTP50, s.ServerTTFTP99 = a.server.Quantile(0.50), a.server.Quantile(0.99)
	s.FaultTTFTP99 = a.faultTTFT.Quantile(0.99)
	s.MigrationGapP50, s.MigrationGapP99 = a.migrationGap.Quantile(0.50), a.migrationGap.Quantile(0.99)
	s.StallGapP50, s.StallGapP99 = a.stallGap.Quantile(0.50), a.stallGap.Quantile(0.99)
	if a.seen {
		s.Span = a.last - a.first
	}
	if s.Span > 0 {
		s.OutputTokensPerSec = float64(s.CompletionTokens) / s.Span.Seconds()
	}
	if s.PromptTokens > 0 {
		s.HitRate = float64(s.CachedTokens) / float64(s.PromptTokens)
	}
	s.PredictionAccuracy = a.predicted.share()
	s.TTFTError, s.TTFTCoverage = a.ttftPredicted.medianError(), a.ttftPredicted.coverage()
	s.ITLError = a.itlPredicted.medianError()
	s.SLO = a.slo.summary(a.SLO, s.Span)
	return s
}

// Percentile returns the q-quantile (0 ≤ q ≤ 1) of ds by the nearest-rank
// method, or 0 for no samples. It sorts ds.
func Percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(q*float64(len(ds))+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// Imbalance returns max/mean of busy times (1 = even), or 0 if all are zero.
func Imbalance(busy []time.Duration) float64 {
	var sum, most time.Duration
	for _, b := range busy {
		sum += b
		most = max(most, b)
	}
	if sum == 0 {
		return 0
	}
	return float64(most) / (float64(sum) / float64(len(busy)))
}

// WriteTable prints summaries side by side, one column per run. With
// non-zero bounds it adds the hit rate as a fraction of the ideal bound.
// It is one row a line, in the order the table prints them: its length is
// the table's.
func WriteTable(w io.Writer, sums []Summary, bounds Bounds) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(label string, cell func(Summary) string) {
		cells := []string{label}
		for _, s := range sums {
			cells = append(cells, cell(s))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
	row("", func(s Summary) string { return s.Name })
	row("requests", func(s Summary) string { return fmt.Sprint(s.Requests) })
	row("errors", func(s Summary) string { return fmt.Sprint(s.Errors) })
	if slices.ContainsFunc(sums, func(s Summary) bool { return s.FaultRequests > 0 || s.Errors > 0 }) {
		// How the errors failed matters as much as how many: a lost request
		// can be retried by the client, a silent cut looks like a network
		// fault halfway through an answer.
		row("  requests lost", func(s Summary) string { return fmt.Sprint(s.Lost) })
		row("  streams cut with an error event", func(s Summary) string { return fmt.Sprint(s.CutWithEvent) })
		row("  streams cut silently", func(s Summary) string { return fmt.Sprint(s.CutSilent) })
	}
	if slices.ContainsFunc(sums, func(s Summary) bool { return s.FaultRequests > 0 }) {
		row("requests sent during faults", func(s Summary) string { return fmt.Sprint(s.FaultRequests) })
		row("TTFT p99 during faults", func(s Summary) string { return ms(s.FaultTTFTP99) })
		// A stall is only seen as a cut after the idle timeout: its gaps
		// would hide the others'.
		gaps := func(n func(Summary) int, p50, p99 func(Summary) time.Duration) func(Summary) string {
			return func(s Summary) string {
				if n(s) == 0 {
					return "-"
				}
				return ms(p50(s)) + " / " + ms(p99(s))
			}
		}
		reset := func(s Summary) int { return s.Migrated - s.MigratedStalled }
		stalled := func(s Summary) int { return s.MigratedStalled }
		row("streams continued after a kill or cut", func(s Summary) string { return fmt.Sprint(reset(s)) })
		row("  cut to next token p50 / p99", gaps(reset,
			func(s Summary) time.Duration { return s.MigrationGapP50 }, func(s Summary) time.Duration { return s.MigrationGapP99 }))
		row("streams continued after a stall", func(s Summary) string { return fmt.Sprint(s.MigratedStalled) })
		row("  last token to next p50 / p99", gaps(stalled,
			func(s Summary) time.Duration { return s.StallGapP50 }, func(s Summary) time.Duration { return s.StallGapP99 }))
		row("  kvroute's count: continued / other", func(s Summary) string {
			if s.RouterMigrations == nil {
				return "-"
			}
			other := 0
			for outcome, n := range s.RouterMigrations {
				if outcome != "continued" {
					other += n
				}
			}
			return fmt.Sprintf("%d / %d", s.RouterMigrations["continued"], other)
		})
	}
	if slices.ContainsFunc(sums, func(s Summary) bool { return s.TextChecked > 0 }) {
		row("replies not the emulators' text", func(s Summary) string { return fmt.Sprintf("%d of %d", s.TextWrong, s.TextChecked) })
	}
	row("TTFT p50", func(s Summary) string { return ms(s.TTFTP50) })
	row("TTFT p99", func(s Summary) string { return ms(s.TTFTP99) })
	if sums[0].ServerTTFTP50 > 0 {
		row("TTFT p50 at the backend", func(s Summary) string { return ms(s.ServerTTFTP50) })
		row("TTFT p99 at the backend", func(s Summary) string { return ms(s.ServerTTFTP99) })
	}
	row("end-to-end p50", func(s Summary) string { return ms(s.E2EP50) })
	row("end-to-end p99", func(s Summary) string { return ms(s.E2EP99) })
	if sums[0].ITLP50 > 0 {
		row("inter-token p50", func(s Summary) string { return fmt.Sprintf("%.1f ms", float64(s.ITLP50)/float64(time.Millisecond)) })
		row("inter-token p99", func(s Summary) string { return fmt.Sprintf("%.1f ms", float64(s.ITLP99)/float64(time.Millisecond)) })
		row("output tokens/s", func(s Summary) string { return fmt.Sprintf("%.0f", s.OutputTokensPerSec) })
	}
	row("prefill tokens computed", func(s Summary) string { return fmt.Sprint(s.PromptTokens - s.CachedTokens) })
	row("prompt-cache hit rate", func(s Summary) string { return fmt.Sprintf("%.1f %%", 100*s.HitRate) })
	if bounds.Ideal > 0 {
		row(fmt.Sprintf("  of ideal bound (%.1f %%)", 100*bounds.Ideal), func(s Summary) string { return fmt.Sprintf("%.0f %%", 100*s.HitRate/bounds.Ideal) })
	}
	if bounds.Unlimited > 0 {
		row(fmt.Sprintf("  of unlimited cache (%.1f %%)", 100*bounds.Unlimited), func(s Summary) string { return fmt.Sprintf("%.0f %%", 100*s.HitRate/bounds.Unlimited) })
	}
	if slices.ContainsFunc(sums, func(s Summary) bool { return s.PredictionAccuracy > 0 }) {
		row("cached tokens predicted to the block", func(s Summary) string {
			if s.PredictionAccuracy == 0 {
				return "-" // a policy that does not predict
			}
			return fmt.Sprintf("%.1f %%", 100*s.PredictionAccuracy)
		})
	}
	if slices.ContainsFunc(sums, func(s Summary) bool { return s.TTFTError > 0 }) {
		predicts := func(f func(Summary) string) func(Summary) string {
			return func(s Summary) string {
				if s.TTFTError == 0 {
					return "-" // a policy that does not predict
				}
				return f(s)
			}
		}
		row("TTFT prediction error (median)", predicts(func(s Summary) string { return fmt.Sprintf("%.1f %%", 100*s.TTFTError) }))
		row("  inside the 80 % interval", predicts(func(s Summary) string { return fmt.Sprintf("%.1f %%", 100*s.TTFTCoverage) }))
	}
	if slices.ContainsFunc(sums, func(s Summary) bool { return s.ITLError > 0 }) {
		row("time between tokens, prediction error (median)", func(s Summary) string {
			if s.ITLError == 0 {
				return "-" // a policy that does not predict it
			}
			return fmt.Sprintf("%.1f %%", 100*s.ITLError)
		})
	}
	row("load imbalance (max/mean busy)", func(s Summary) string { return fmt.Sprintf("%.2f", s.Imbalance) })
	if slices.ContainsFunc(sums, func(s Summary) bool { return s.AdapterLoads > 0 }) {
		row("LoRA adapter loads", func(s Summary) string { return fmt.Sprint(s.AdapterLoads) })
	}
	if o := sums[0].SLO; o != nil {
		slo := func(f func(*SLOSummary) string) func(Summary) string {
			return func(s Summary) string {
				if s.SLO == nil {
					return "-"
				}
				return f(s.SLO)
			}
		}
		pct := func(x float64) string { return fmt.Sprintf("%.1f %%", 100*x) }
		row("goodput ("+o.SLO.String()+")", slo(func(g *SLOSummary) string { return pct(g.Goodput) }))
		row("  requests/s meeting it", slo(func(g *SLOSummary) string { return fmt.Sprintf("%.2f", g.GoodputRate) }))
		row("  over the TTFT bound", slo(func(g *SLOSummary) string { return pct(g.TTFTMissed) }))
		row("  over the TPOT bound", slo(func(g *SLOSummary) string { return pct(g.TPOTMissed) }))
		row("  failed", slo(func(g *SLOSummary) string { return pct(g.Rejected) }))
	}
	return tw.Flush()
}
