// Package report renders a results.Report as one self-contained HTML page:
// the summary table and SVG charts (TTFT distribution, cache hit rate, load
// per backend, goodput), with inline CSS and no scripts. The page template
// is report.html.tmpl, embedded in the binary.
package report

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/kvroute/kvroute/internal/results"
)

// WriteHTML renders r as dir/report.html, creating dir: one self-contained
// file (inline CSS and SVG, no scripts from anywhere, no external fonts or
// images), readable offline and printable.
func WriteHTML(dir string, r *results.Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// Render fully before writing so a failure leaves no half-written page.
	var buf bytes.Buffer
	if err := Render(&buf, r); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.html"), buf.Bytes(), 0o644)
}

// Render writes the page WriteHTML saves to w.
func Render(w io.Writer, r *results.Report) error {
	if err := reportTemplate.Execute(w, page(r)); err != nil {
		return fmt.Errorf("report: rendering: %w", err)
	}
	return nil
}

type reportPage struct {
	Title       string
	Description string
	Facts       []fact
	Groups      []headerGroup
	SubHeads    []string
	Rows        []tableRow
	NoRuns      bool
	CDF         template.HTML
	HitRate     template.HTML
	HitNote     string
	Backends    []swatch
	Loads       []loadPanel
	Goodput     *goodputSection
}

type fact struct{ Label, Value string }

func page(r *results.Report) reportPage {
	styles := policyStyles(r.Runs)
	p := reportPage{
		Title:       "kvroute bench",
		Description: r.Description,
		NoRuns:      len(r.Runs) == 0,
	}
	if r.Simulated {
		p.Title = "kvroute sim"
	}
	if r.Workload != "" {
		p.Title += ": " + r.Workload
	}
	p.Facts = facts(r)
	var cols []column
	cols, p.Rows = summaryTable(r, styles)
	p.Groups, p.SubHeads = headerGroups(cols)
	p.CDF = ttftCDF(r.Runs, styles)
	p.HitRate = hitRateChart(r.Runs, styles, r.Bounds)
	p.HitNote = "The bounds were not computed for this run."
	if r.Bounds.Ideal == 0 && r.Bounds.Unlimited != 0 {
		p.HitNote = fmt.Sprintf("Unlimited-cache bound %s: every repeated block hits. The fleet's cache capacity is "+
			"unknown, so there is no ideal-router bound.", fmtPct(r.Bounds.Unlimited))
	} else if r.Bounds.Ideal != 0 || r.Bounds.Unlimited != 0 {
		p.HitNote = fmt.Sprintf("Ideal-router bound %s: one LRU cache pooling every backend's KV blocks, no block held twice "+
			"(a perfect router at the fleet's real capacity). Unlimited-cache bound %s: every repeated block hits.",
			fmtPct(r.Bounds.Ideal), fmtPct(r.Bounds.Unlimited))
	}
	p.Backends, p.Loads = loadCharts(r.Runs, styles)
	p.Goodput = goodput(r.Runs, styles)
	return p
}

func facts(r *results.Report) []fact {
	fleet := "unknown"
	if r.Backends > 0 {
		fleet = fmt.Sprintf("%d backends", r.Backends)
		if r.Profile != "" {
			fleet += " × " + r.Profile
		}
		if r.KVTokensPerBackend > 0 {
			fleet += fmt.Sprintf(", %s KV tokens each", fmtThousands(int64(r.KVTokensPerBackend)))
		}
	}
	scale := "1 (real time)"
	if ts := r.TimeScale; ts > 0 && finite(ts) && ts != 1 {
		pace := fmt.Sprintf("%s× faster", strconv.FormatFloat(1/ts, 'g', 3, 64))
		if ts > 1 {
			pace = fmt.Sprintf("%s× slower", strconv.FormatFloat(ts, 'g', 3, 64))
		}
		scale = fmt.Sprintf("%s wall seconds per model second (%s than real time)", strconv.FormatFloat(ts, 'g', 4, 64), pace)
	}
	date := "unknown"
	if !r.Created.IsZero() {
		date = r.Created.Format("2006-01-02 15:04:05 MST")
	}
	if r.Simulated {
		scale = fmt.Sprintf("virtual (simulated), %d router replica(s)", max(r.Routers, 1))
	}
	return []fact{
		{"Workload", orDash(r.Workload)},
		{"Fleet", fleet},
		{"Time scale", scale},
		{"Seed", strconv.FormatUint(r.Seed, 10)},
		{"Date", date},
	}
}

// reportTemplate is report.html.tmpl parsed; it renders a reportPage.
//
//go:embed report.html.tmpl
var reportText string

var reportTemplate = template.Must(template.New("report").Parse(reportText))
