package bench

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
	Name string
	// Requests and Errors count what was sent and what failed.
	Requests, Errors int
	// TTFT and E2E percentiles over successful requests.
	TTFTP50, TTFTP99, E2EP50, E2EP99 time.Duration
	// PromptTokens and CachedTokens sum the responses' usage; HitRate is
	// their ratio.
	PromptTokens, CachedTokens int
	HitRate                    float64
	// Imbalance is the busiest backend's busy time over the mean (1 is
	// perfectly even); 0 when unknown.
	Imbalance float64
}

// Summarize aggregates results.
func Summarize(name string, results []Result) Summary {
	s := Summary{Name: name, Requests: len(results)}
	var ttft, e2e []time.Duration
	for _, r := range results {
		if r.Err != nil {
			s.Errors++
			continue
		}
		ttft = append(ttft, r.TTFT)
		e2e = append(e2e, r.E2E)
		s.PromptTokens += r.PromptTokens
		s.CachedTokens += r.CachedTokens
	}
	s.TTFTP50, s.TTFTP99 = Percentile(ttft, 0.50), Percentile(ttft, 0.99)
	s.E2EP50, s.E2EP99 = Percentile(e2e, 0.50), Percentile(e2e, 0.99)
	if s.PromptTokens > 0 {
		s.HitRate = float64(s.CachedTokens) / float64(s.PromptTokens)
	}
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

// WriteTable prints summaries side by side, one column per run.
func WriteTable(w io.Writer, sums []Summary) error {
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
	row("TTFT p50", func(s Summary) string { return ms(s.TTFTP50) })
	row("TTFT p99", func(s Summary) string { return ms(s.TTFTP99) })
	row("end-to-end p50", func(s Summary) string { return ms(s.E2EP50) })
	row("end-to-end p99", func(s Summary) string { return ms(s.E2EP99) })
	row("prompt-cache hit rate", func(s Summary) string { return fmt.Sprintf("%.1f %%", 100*s.HitRate) })
	row("load imbalance (max/mean busy)", func(s Summary) string { return fmt.Sprintf("%.2f", s.Imbalance) })
	return tw.Flush()
}
