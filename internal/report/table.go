package report

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/results"
)

// column is a summary-table column; consecutive columns of one Group
// share a header cell above their own names.
type column struct{ Group, Name, Unit string }

// headerGroup is a cell of the table's first header row.
type headerGroup struct {
	Name, Unit string
	Span       int // columns covered; 1 for a column without a group
}

type cell struct {
	Text string
	Best bool
}

type tableRow struct {
	Policy  string
	Color   string
	KVRoute bool
	Cells   []cell
}

// tableColumn computes one column: value reports a run's value and whether
// it has one; better is -1 when lower wins, +1 when higher wins, 0 when no
// value is better than another.
type tableColumn struct {
	column
	better int
	value  func(results.Run) (float64, bool)
	format func(float64) string
}

// summaryTable is the summary table's columns and rows. It is one long
// list of rows, one a line, in the order the page shows them: split, the
// order would be harder to read than the function is long.
func summaryTable(r *results.Report, styles []policyStyle) ([]column, []tableRow) {
	succeeded := func(run results.Run) bool { return run.Summary.Requests-run.Summary.Errors > 0 }
	latency := func(d func(results.Summary) time.Duration) func(results.Run) (float64, bool) {
		return func(run results.Run) (float64, bool) { return float64(d(run.Summary)), succeeded(run) }
	}
	durCol := func(group, name string, d func(results.Summary) time.Duration) tableColumn {
		return tableColumn{column{group, name, ""}, -1, latency(d), func(v float64) string { return fmtDur(time.Duration(v)) }}
	}
	intFmt := func(v float64) string { return fmtThousands(int64(v)) }
	cols := []tableColumn{
		{column{"", "requests", ""}, 0, func(run results.Run) (float64, bool) { return float64(run.Summary.Requests), true }, intFmt},
		{column{"", "errors", ""}, -1, func(run results.Run) (float64, bool) { return float64(run.Summary.Errors), true }, intFmt},
		durCol("TTFT", "p50", func(s results.Summary) time.Duration { return s.TTFTP50 }),
		durCol("TTFT", "p99", func(s results.Summary) time.Duration { return s.TTFTP99 }),
		durCol("end-to-end", "p50", func(s results.Summary) time.Duration { return s.E2EP50 }),
		durCol("end-to-end", "p99", func(s results.Summary) time.Duration { return s.E2EP99 }),
		{column{"ITL", "p50", ""}, -1, func(run results.Run) (float64, bool) { return float64(run.Summary.ITLP50), run.Summary.ITLP50 > 0 },
			func(v float64) string { return fmtDur(time.Duration(v)) }},
		{column{"ITL", "p99", ""}, -1, func(run results.Run) (float64, bool) { return float64(run.Summary.ITLP99), run.Summary.ITLP99 > 0 },
			func(v float64) string { return fmtDur(time.Duration(v)) }},
		{column{"", "output", "tokens/s"}, +1, func(run results.Run) (float64, bool) {
			v := run.Summary.OutputTokensPerSec
			return v, finite(v) && run.Summary.Span > 0
		}, fmtRate},
		{column{"hit rate", "total", ""}, +1, func(run results.Run) (float64, bool) {
			v := run.Summary.HitRate
			return v, finite(v) && run.Summary.PromptTokens > 0
		}, fmtPct},
		{column{"hit rate", "of ideal", ""}, +1, func(run results.Run) (float64, bool) {
			v := run.Summary.HitRate / r.Bounds.Ideal
			return v, finite(v) && r.Bounds.Ideal > 0 && run.Summary.PromptTokens > 0
		}, func(v float64) string { return fmt.Sprintf("%.0f %%", 100*v) }},
		{column{"", "imbalance", "max/mean busy"}, -1, func(run results.Run) (float64, bool) {
			v := imbalanceOf(run)
			return v, v > 0
		}, func(v float64) string { return fmt.Sprintf("%.2f", v) }},
	}
	if slices.ContainsFunc(r.Runs, func(run results.Run) bool { return run.Summary.FaultRequests > 0 }) {
		// A fault run (bench --faults): how the errors failed, and TTFT
		// while the faults were in force.
		// Grouped columns show no unit: the names say it all.
		count := func(name string, n func(results.Summary) int) tableColumn {
			return tableColumn{column{"faults", name, ""}, -1, func(run results.Run) (float64, bool) { return float64(n(run.Summary)), true }, intFmt}
		}
		cols = append(cols,
			count("requests lost", func(s results.Summary) int { return s.Lost }),
			count("cut, error event", func(s results.Summary) int { return s.CutWithEvent }),
			count("cut, silent", func(s results.Summary) int { return s.CutSilent }),
			tableColumn{column{"faults", "TTFT p99 in faults", ""}, -1, func(run results.Run) (float64, bool) {
				return float64(run.Summary.FaultTTFTP99), run.Summary.FaultTTFTP99 > 0
			}, func(v float64) string { return fmtDur(time.Duration(v)) }},
			// How many cuts a migration hid depends on how many cuts there
			// were: neither more nor fewer is better.
			tableColumn{column{"faults", "streams continued", ""}, 0, func(run results.Run) (float64, bool) {
				return float64(run.Summary.Migrated), true
			}, intFmt},
			tableColumn{column{"faults", "cut to next token p99", ""}, -1, func(run results.Run) (float64, bool) {
				s := run.Summary
				return float64(s.MigrationGapP99), s.Migrated > s.MigratedStalled
			}, func(v float64) string { return fmtDur(time.Duration(v)) }},
		)
	}
	if slices.ContainsFunc(r.Runs, func(run results.Run) bool { return run.Summary.TTFTError > 0 }) {
		// How far the policy's predicted TTFT was from the observed one:
		// only policies that predict have a value.
		cols = append(cols,
			tableColumn{column{"TTFT prediction", "error p50", ""}, -1, func(run results.Run) (float64, bool) {
				return run.Summary.TTFTError, run.Summary.TTFTError > 0
			}, fmtPct},
			tableColumn{column{"TTFT prediction", "in 80 % interval", ""}, 0, func(run results.Run) (float64, bool) {
				return run.Summary.TTFTCoverage, run.Summary.TTFTError > 0
			}, fmtPct},
		)
	}
	if slices.ContainsFunc(r.Runs, func(run results.Run) bool { return run.Summary.ITLError > 0 }) {
		cols = append(cols, tableColumn{column{"time between tokens prediction", "error p50", ""}, -1, func(run results.Run) (float64, bool) {
			return run.Summary.ITLError, run.Summary.ITLError > 0
		}, fmtPct})
	}
	if slices.ContainsFunc(r.Runs, func(run results.Run) bool { return run.Goodput != nil }) {
		unit := "req/s"
		if slo, ok := commonSLO(r.Runs); ok {
			unit += ", p99 TTFT ≤ " + fmtDur(slo)
		}
		cols = append(cols, tableColumn{column{"", "goodput", unit}, +1, func(run results.Run) (float64, bool) {
			if run.Goodput == nil {
				return 0, false
			}
			return run.Goodput.Rate, finite(run.Goodput.Rate)
		}, fmtRate})
	}

	rows := make([]tableRow, len(r.Runs))
	for i := range r.Runs {
		rows[i] = tableRow{Policy: styles[i].Name, Color: styles[i].Color, KVRoute: styles[i].KVRoute, Cells: make([]cell, len(cols))}
	}
	headers := make([]column, len(cols))
	for c, col := range cols {
		headers[c] = col.column
		vals := make([]float64, len(r.Runs))
		oks := make([]bool, len(r.Runs))
		var best float64
		n, distinct := 0, false
		for i, run := range r.Runs {
			vals[i], oks[i] = col.value(run)
			oks[i] = oks[i] && finite(vals[i])
			if !oks[i] {
				rows[i].Cells[c] = cell{Text: "—"}
				continue
			}
			rows[i].Cells[c] = cell{Text: col.format(vals[i])}
			switch {
			case n == 0:
				best = vals[i]
			case vals[i] != best:
				distinct = true
				if float64(col.better)*(vals[i]-best) > 0 {
					best = vals[i]
				}
			}
			n++
		}
		// Highlighting is only news when there is a difference to see.
		if col.better == 0 || !distinct {
			continue
		}
		for i := range r.Runs {
			if oks[i] && vals[i] == best {
				rows[i].Cells[c].Best = true
			}
		}
	}
	return headers, rows
}

// headerGroups lays out the two header rows: the first has a cell per
// group of columns (or per column without one, spanning both rows), the
// second the names of the grouped columns.
func headerGroups(cols []column) (groups []headerGroup, sub []string) {
	for i := 0; i < len(cols); {
		j := i + 1
		for cols[i].Group != "" && j < len(cols) && cols[j].Group == cols[i].Group {
			j++
		}
		if j-i == 1 {
			name := cols[i].Name
			if cols[i].Group != "" {
				name = cols[i].Group + " " + name
			}
			groups = append(groups, headerGroup{Name: name, Unit: cols[i].Unit, Span: 1})
		} else {
			groups = append(groups, headerGroup{Name: cols[i].Group, Span: j - i})
			for _, c := range cols[i:j] {
				sub = append(sub, c.Name)
			}
		}
		i = j
	}
	return groups, sub
}

// imbalanceOf is the run's busy-time imbalance, from its summary or else
// from the backends' busy times; 0 if unknown.
func imbalanceOf(run results.Run) float64 {
	if v := run.Summary.Imbalance; v > 0 && finite(v) {
		return v
	}
	if len(run.Backends) == 0 {
		return 0
	}
	busy := make([]time.Duration, len(run.Backends))
	for i, b := range run.Backends {
		busy[i] = b.Busy
	}
	if v := results.Imbalance(busy); finite(v) {
		return v
	}
	return 0
}

func commonSLO(runs []results.Run) (time.Duration, bool) {
	var slo time.Duration
	found := false
	for _, run := range runs {
		if run.Goodput == nil {
			continue
		}
		if found && run.Goodput.SLO != slo {
			return 0, false
		}
		slo, found = run.Goodput.SLO, true
	}
	return slo, found
}
