package report

import (
	"bytes"
	"fmt"
	"html/template"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

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

// Colours are fixed so a policy looks the same in every chart and in every
// report: kvroute gets the strongest one, the others a muted palette in the
// order they were run.
const kvrouteColor = "#c81d25"

var policyPalette = []string{
	"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2",
	"#9c755f", "#e0b92e", "#ff9da7", "#8c8c8c", "#17becf",
}

// backendRamp is sampled evenly (viridis, dark to light without the pale
// yellow end), so any number of backends gets distinguishable lines.
var backendRamp = [][3]float64{
	{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {190, 210, 40},
}

// Chart limits keep the file small whatever the run size.
const (
	cdfPoints     = 150 // evenly spaced ranks per CDF line
	cdfTailPoints = 50  // extra ranks in the top 5 %, where p99 lives
	loadBuckets   = 150 // min and max of each: ≤ 300 points per backend
)

type policyStyle struct {
	Name    string
	Color   string
	KVRoute bool
}

func (s policyStyle) stroke() string {
	if s.KVRoute {
		return "2.75"
	}
	return "1.75"
}

func isKVRoute(policy string) bool { return policy == "kvroute" }

func policyStyles(runs []results.Run) []policyStyle {
	byName := map[string]string{}
	next := 0
	styles := make([]policyStyle, len(runs))
	for i, run := range runs {
		name := runName(run)
		color, ok := byName[name]
		switch {
		case ok:
		case isKVRoute(name):
			color = kvrouteColor
		default:
			color = policyPalette[next%len(policyPalette)]
			next++
		}
		byName[name] = color
		styles[i] = policyStyle{Name: name, Color: color, KVRoute: isKVRoute(name)}
	}
	return styles
}

func runName(run results.Run) string {
	switch {
	case run.Policy != "":
		return run.Policy
	case run.Summary.Name != "":
		return run.Summary.Name
	}
	return "(unnamed)"
}

func backendColor(i, n int) string {
	t := 0.0
	if n > 1 {
		t = float64(i) / float64(n-1)
	}
	seg := t * float64(len(backendRamp)-1)
	k := min(int(seg), len(backendRamp)-2)
	f := seg - float64(k)
	a, b := backendRamp[k], backendRamp[k+1]
	c := func(j int) int { return int(math.Round(a[j] + f*(b[j]-a[j]))) }
	return fmt.Sprintf("#%02x%02x%02x", c(0), c(1), c(2))
}

// --- the page ---

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

type swatch struct{ Name, Color string }

type loadPanel struct {
	Policy   string
	Color    string
	Subtitle string
	Chart    template.HTML
}

type goodputSection struct {
	Note   string
	Chart  template.HTML
	Trials []goodputTrials
}

type goodputTrials struct {
	Policy string
	Color  string
	SLO    string
	Rows   []goodputRow
}

type goodputRow struct {
	Rate, P99, Errors string
	Met               bool
}

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

// --- summary table ---

// tableColumn computes one column: value reports a run's value and whether
// it has one; better is -1 when lower wins, +1 when higher wins, 0 when no
// value is better than another.
type tableColumn struct {
	column
	better int
	value  func(results.Run) (float64, bool)
	format func(float64) string
}

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

// --- charts ---

// svgDoc builds one SVG image; every number goes through num and every
// string through template.HTMLEscapeString, so the result is well-formed
// XML whatever the data.
type svgDoc struct {
	b strings.Builder
}

func newSVG(w, h float64, label string) *svgDoc {
	s := &svgDoc{}
	fmt.Fprintf(&s.b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %s %s" width="%s" role="img" aria-label="%s" font-family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif" font-size="12">`,
		num(w), num(h), num(w), esc(label))
	return s
}

func (s *svgDoc) line(x1, y1, x2, y2 float64, stroke, width, dash string) {
	fmt.Fprintf(&s.b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="%s"`, num(x1), num(y1), num(x2), num(y2), stroke, width)
	if dash != "" {
		fmt.Fprintf(&s.b, ` stroke-dasharray="%s"`, dash)
	}
	s.b.WriteString("/>")
}

// text writes a label; anchor is start, middle or end; extra is raw
// attributes built by this file.
func (s *svgDoc) text(x, y float64, anchor, fill, extra, text string) {
	fmt.Fprintf(&s.b, `<text x="%s" y="%s" text-anchor="%s" fill="%s"%s>%s</text>`, num(x), num(y), anchor, fill, extra, esc(text))
}

func (s *svgDoc) rect(x, y, w, h float64, fill, extra string) {
	fmt.Fprintf(&s.b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s"%s/>`, num(x), num(y), num(max(w, 0)), num(max(h, 0)), fill, extra)
}

func (s *svgDoc) polyline(pts [][2]float64, stroke, width string) {
	if len(pts) == 0 {
		return
	}
	fmt.Fprintf(&s.b, `<polyline fill="none" stroke="%s" stroke-width="%s" stroke-linejoin="round" points="`, stroke, width)
	for i, p := range pts {
		if i > 0 {
			s.b.WriteByte(' ')
		}
		s.b.WriteString(num(p[0]))
		s.b.WriteByte(',')
		s.b.WriteString(num(p[1]))
	}
	s.b.WriteString(`"/>`)
}

func (s *svgDoc) done() template.HTML {
	s.b.WriteString("</svg>")
	return template.HTML(s.b.String()) // built only from escaped text and numbers
}

func emptyChart(w float64, msg string) template.HTML {
	s := newSVG(w, 60, msg)
	s.rect(0.5, 0.5, w-1, 59, "#fafafa", ` stroke="#ddd"`)
	s.text(w/2, 35, "middle", "#777", "", msg)
	return s.done()
}

const (
	axisColor = "#444"
	gridColor = "#e4e4e4"
	textColor = "#555"
)

// ttftCDF plots the distribution of TTFT of the successful requests, one
// line per policy, on a log time axis.
func ttftCDF(runs []results.Run, styles []policyStyle) template.HTML {
	const w = 960.0
	series := make([][]float64, len(runs))
	lo, hi := math.Inf(1), 0.0
	for i, run := range runs {
		for _, res := range run.Requests {
			if res.Err != nil || res.Error != "" {
				continue
			}
			ms := float64(res.TTFT) / float64(time.Millisecond)
			series[i] = append(series[i], ms)
			if ms > 0 {
				lo, hi = min(lo, ms), max(hi, ms)
			}
		}
		slices.Sort(series[i])
	}
	if hi == 0 {
		return emptyChart(w, "No successful requests to plot.")
	}
	// Whole decades, at least one, no finer than a microsecond.
	lo = math.Pow(10, math.Floor(math.Log10(max(lo, 1e-3))))
	hi = math.Pow(10, math.Ceil(math.Log10(hi)))
	if hi <= lo {
		hi = lo * 10
	}
	decades := int(math.Round(math.Log10(hi / lo)))

	left, top := 64.0, 14.0
	right := w - 200
	h := max(360, top+18*float64(len(runs))+60)
	bottom := h - 48
	pw, ph := right-left, bottom-top
	x := func(ms float64) float64 {
		ms = min(max(ms, lo), hi)
		return left + math.Log10(ms/lo)/math.Log10(hi/lo)*pw
	}
	y := func(f float64) float64 { return bottom - f*ph }

	s := newSVG(w, h, "Cumulative distribution of time to first token per policy")
	for _, f := range []float64{0, 0.25, 0.5, 0.75, 0.9, 1} {
		s.line(left, y(f), right, y(f), gridColor, "1", "")
		s.text(left-6, y(f)+4, "end", textColor, "", strconv.FormatFloat(f, 'g', -1, 64))
	}
	for d := 0; d < decades; d++ {
		base := lo * math.Pow(10, float64(d))
		for m := 2.0; m < 10; m++ {
			labelled := decades <= 2 && (m == 2 || m == 5)
			color := "#f2f2f2"
			if labelled {
				color = gridColor
				s.text(x(base*m), bottom+16, "middle", textColor, "", msLabel(base*m))
			}
			s.line(x(base*m), top, x(base*m), bottom, color, "1", "")
		}
	}
	for d := 0; d <= decades; d++ {
		v := lo * math.Pow(10, float64(d))
		s.line(x(v), top, x(v), bottom+4, "#ccc", "1", "")
		s.text(x(v), bottom+16, "middle", axisColor, "", msLabel(v))
	}
	s.line(left, bottom, right, bottom, axisColor, "1", "")
	s.line(left, top, left, bottom, axisColor, "1", "")
	s.text((left+right)/2, h-8, "middle", axisColor, "", "time to first token (model time, log scale)")
	s.text(16, (top+bottom)/2, "middle", axisColor, fmt.Sprintf(` transform="rotate(-90 16 %s)"`, num((top+bottom)/2)), "fraction of requests")

	// kvroute last, so it is drawn on top.
	order := make([]int, 0, len(runs))
	for i := range runs {
		if !styles[i].KVRoute {
			order = append(order, i)
		}
	}
	for i := range runs {
		if styles[i].KVRoute {
			order = append(order, i)
		}
	}
	for _, i := range order {
		vals := series[i]
		if len(vals) == 0 {
			continue
		}
		n := float64(len(vals))
		pts := [][2]float64{{x(vals[0]), y(0)}}
		for _, k := range cdfRanks(len(vals)) {
			pts = append(pts, [2]float64{x(vals[k]), y(float64(k+1) / n)})
		}
		s.polyline(pts, styles[i].Color, styles[i].stroke())
	}
	for i, st := range styles {
		ly := top + 8 + 18*float64(i)
		s.line(right+20, ly, right+44, ly, st.Color, st.stroke(), "")
		label := st.Name
		if len(series[i]) == 0 {
			label += " (no data)"
		}
		weight := ""
		if st.KVRoute {
			weight = ` font-weight="bold"`
		}
		s.text(right+50, ly+4, "start", "#222", weight, truncate(label, 24))
	}
	return s.done()
}

// cdfRanks picks the ranks (0-based indexes into n sorted values) to plot:
// evenly spaced, plus a denser run through the top 5 % so the p99 tail has
// shape, always ending with the largest.
func cdfRanks(n int) []int {
	var ks []int
	add := func(q float64) {
		k := int(math.Ceil(q*float64(n))) - 1
		ks = append(ks, min(max(k, 0), n-1))
	}
	for j := 1; j <= cdfPoints; j++ {
		add(float64(j) / cdfPoints)
	}
	for j := range cdfTailPoints {
		add(0.95 + 0.05*float64(j)/cdfTailPoints)
	}
	slices.Sort(ks)
	return slices.Compact(ks)
}

type bar struct {
	label   string
	color   string
	strong  bool
	value   float64 // 0 to max; ignored unless ok
	ok      bool
	caption string // printed after the bar
}

type refLine struct {
	value float64
	label string
	dash  string
}

// barChart draws horizontal bars from 0 to maxV, with labelled vertical
// reference lines, each reference label on its own row so close values
// cannot overlap.
func barChart(title string, bars []bar, maxV float64, ticks []float64, tick func(float64) string, refs []refLine) template.HTML {
	const w, rowH, barH = 960.0, 28.0, 18.0
	refs = slices.DeleteFunc(refs, func(r refLine) bool { return !finite(r.value) || r.value <= 0 })
	if len(bars) == 0 && len(refs) == 0 {
		return emptyChart(w, "Nothing to plot.")
	}
	if !(maxV > 0) || !finite(maxV) {
		maxV = 1
	}
	left, right := 180.0, w-230
	top := 10 + 18*float64(len(refs))
	bottom := top + 6 + rowH*float64(max(len(bars), 1))
	h := bottom + 40
	x := func(v float64) float64 { return left + min(max(v, 0), maxV)/maxV*(right-left) }

	s := newSVG(w, h, title)
	for _, t := range ticks {
		s.line(x(t), top, x(t), bottom, gridColor, "1", "")
		s.text(x(t), bottom+16, "middle", textColor, "", tick(t))
	}
	// Bars, then reference lines over them, then text with a white halo
	// over both, so a caption crossing a line stays readable.
	const halo = ` stroke="#fff" stroke-width="4" stroke-linejoin="round" paint-order="stroke"`
	ends := make([]float64, len(bars))
	rowY := func(i int) float64 { return top + 6 + rowH*float64(i) }
	for i, b := range bars {
		ends[i] = left
		if b.ok && finite(b.value) {
			ends[i] = x(b.value)
			extra := ""
			if b.strong {
				extra = ` stroke="#5c0a0f" stroke-width="1"`
			}
			s.rect(left, rowY(i), ends[i]-left, barH, b.color, extra)
		}
	}
	s.line(left, bottom, right, bottom, axisColor, "1", "")
	s.line(left, top, left, bottom, axisColor, "1", "")
	for i, ref := range refs {
		ly := 10 + 18*float64(i) + 4
		rx := x(ref.value)
		s.line(rx, ly+4, rx, bottom, "#222", "1.5", ref.dash)
		if rx > left+(right-left)*0.6 {
			s.text(rx-5, ly+4, "end", "#222", halo, ref.label)
		} else {
			s.text(rx+5, ly+4, "start", "#222", halo, ref.label)
		}
	}
	for i, b := range bars {
		weight := ""
		if b.strong {
			weight = ` font-weight="bold"`
		}
		s.text(left-8, rowY(i)+barH/2+4, "end", "#222", weight, truncate(b.label, 26))
		s.text(ends[i]+6, rowY(i)+barH/2+4, "start", "#222", weight+halo, b.caption)
	}
	return s.done()
}

func hitRateChart(runs []results.Run, styles []policyStyle, bounds results.Bounds) template.HTML {
	bars := make([]bar, len(runs))
	for i, run := range runs {
		v := run.Summary.HitRate
		ok := finite(v) && run.Summary.PromptTokens > 0
		caption := "—"
		if ok {
			caption = fmtPct(v)
			if bounds.Ideal > 0 && finite(bounds.Ideal) {
				caption += fmt.Sprintf(" · %.0f %% of ideal", 100*v/bounds.Ideal)
			}
		}
		bars[i] = bar{label: styles[i].Name, color: styles[i].Color, strong: styles[i].KVRoute, value: v, ok: ok, caption: caption}
	}
	var ticks []float64
	for t := 0; t <= 10; t++ {
		ticks = append(ticks, float64(t)/10)
	}
	return barChart("Prompt-cache hit rate per policy against the bounds", bars, 1, ticks,
		func(v float64) string { return fmt.Sprintf("%.0f %%", 100*v) },
		[]refLine{
			{bounds.Unlimited, "unlimited-cache bound " + fmtPct(bounds.Unlimited), "2 3"},
			{bounds.Ideal, "ideal-router bound " + fmtPct(bounds.Ideal), "7 4"},
		})
}

// loadCharts draws one small chart per run of each backend's running +
// waiting requests over model time, all on the same axes.
func loadCharts(runs []results.Run, styles []policyStyle) ([]swatch, []loadPanel) {
	const w, h = 470.0, 200.0
	var names []string
	maxT, maxQ := 0.0, 0
	for _, run := range runs {
		for _, b := range run.Backends {
			if !slices.Contains(names, b.Name) {
				names = append(names, b.Name)
			}
			for _, smp := range b.Samples {
				maxT = max(maxT, smp.At.Seconds())
				maxQ = max(maxQ, smp.Running+smp.Waiting)
			}
		}
	}
	legend := make([]swatch, len(names))
	colors := map[string]string{}
	for i, n := range names {
		colors[n] = backendColor(i, len(names))
		legend[i] = swatch{Name: n, Color: colors[n]}
	}
	// Time runs to the last sample, not to a round number past it.
	maxX := maxT
	if !(maxX > 0) {
		maxX = 1
	}
	xt := slices.DeleteFunc(niceTicks(maxX, 5), func(t float64) bool { return t > maxX*(1+1e-9) })
	yt := niceTicks(float64(maxQ), 4)
	maxY := yt[len(yt)-1]

	left, right, top, bottom := 44.0, w-12, 10.0, h-36
	x := func(t float64) float64 { return left + min(max(t, 0), maxX)/maxX*(right-left) }
	y := func(q float64) float64 { return bottom - min(max(q, 0), maxY)/maxY*(bottom-top) }

	panels := make([]loadPanel, len(runs))
	for i, run := range runs {
		p := loadPanel{Policy: styles[i].Name, Color: styles[i].Color, Subtitle: loadSubtitle(run)}
		if !slices.ContainsFunc(run.Backends, func(b results.BackendSeries) bool { return len(b.Samples) > 0 }) {
			p.Chart = emptyChart(w, "No load samples.")
			panels[i] = p
			continue
		}
		s := newSVG(w, h, "Running and waiting requests per backend over time, "+styles[i].Name)
		for _, t := range yt {
			s.line(left, y(t), right, y(t), gridColor, "1", "")
			s.text(left-5, y(t)+4, "end", textColor, "", strconv.FormatFloat(t, 'g', -1, 64))
		}
		for _, t := range xt {
			s.line(x(t), bottom, x(t), bottom+4, axisColor, "1", "")
			s.text(x(t), bottom+16, "middle", textColor, "", strconv.FormatFloat(t, 'g', -1, 64))
		}
		s.line(left, bottom, right, bottom, axisColor, "1", "")
		s.line(left, top, left, bottom, axisColor, "1", "")
		s.text((left+right)/2, h-4, "middle", axisColor, "", "model time (s)")
		for _, b := range run.Backends {
			samples := downsampleLoad(b.Samples)
			pts := make([][2]float64, len(samples))
			for k, smp := range samples {
				pts[k] = [2]float64{x(smp.At.Seconds()), y(float64(smp.Running + smp.Waiting))}
			}
			s.polyline(pts, colors[b.Name], "1.1")
		}
		p.Chart = s.done()
		panels[i] = p
	}
	return legend, panels
}

func loadSubtitle(run results.Run) string {
	var parts []string
	if v := imbalanceOf(run); v > 0 {
		parts = append(parts, fmt.Sprintf("busy-time imbalance %.2f (busiest / mean)", v))
	} else {
		parts = append(parts, "busy-time imbalance unknown")
	}
	var busiest *results.BackendSeries
	for k := range run.Backends {
		if b := &run.Backends[k]; b.Busy > 0 && (busiest == nil || b.Busy > busiest.Busy) {
			busiest = b
		}
	}
	if busiest != nil {
		parts = append(parts, fmt.Sprintf("busiest %s, %s busy", busiest.Name, fmtDur(busiest.Busy)))
	}
	peak := 0
	for _, b := range run.Backends {
		for _, smp := range b.Samples {
			peak = max(peak, smp.Running+smp.Waiting)
		}
	}
	if peak > 0 {
		parts = append(parts, fmt.Sprintf("peak %d requests on one backend", peak))
	}
	return strings.Join(parts, " · ")
}

// downsampleLoad keeps at most 2×loadBuckets samples: the lowest and the
// highest of each bucket, in time order, so spikes survive.
func downsampleLoad(ss []results.LoadSample) []results.LoadSample {
	if len(ss) <= 2*loadBuckets {
		return ss
	}
	out := make([]results.LoadSample, 0, 2*loadBuckets)
	q := func(s results.LoadSample) int { return s.Running + s.Waiting }
	for b := range loadBuckets {
		from, to := b*len(ss)/loadBuckets, (b+1)*len(ss)/loadBuckets
		lo, hi := from, from
		for k := from; k < to; k++ {
			if q(ss[k]) < q(ss[lo]) {
				lo = k
			}
			if q(ss[k]) > q(ss[hi]) {
				hi = k
			}
		}
		switch {
		case lo == hi:
			out = append(out, ss[lo])
		case lo < hi:
			out = append(out, ss[lo], ss[hi])
		default:
			out = append(out, ss[hi], ss[lo])
		}
	}
	return out
}

func goodput(runs []results.Run, styles []policyStyle) *goodputSection {
	if !slices.ContainsFunc(runs, func(run results.Run) bool { return run.Goodput != nil }) {
		return nil
	}
	g := &goodputSection{Note: "Highest arrival rate (requests/s) at which p99 TTFT stayed within the SLO."}
	if slo, ok := commonSLO(runs); ok {
		g.Note = fmt.Sprintf("Highest arrival rate (requests/s) at which p99 TTFT stayed within %s.", fmtDur(slo))
	}
	bars := make([]bar, len(runs))
	top := 0.0
	for i, run := range runs {
		b := bar{label: styles[i].Name, color: styles[i].Color, strong: styles[i].KVRoute, caption: "not measured"}
		if gp := run.Goodput; gp != nil {
			b.ok = finite(gp.Rate)
			b.value = gp.Rate
			switch {
			case !b.ok:
				b.caption = "—"
			case gp.Rate <= 0:
				b.caption = "no rate tried met the SLO"
			default:
				b.caption = fmtRate(gp.Rate) + " req/s"
				top = max(top, gp.Rate)
			}
			t := goodputTrials{Policy: styles[i].Name, Color: styles[i].Color, SLO: fmtDur(gp.SLO)}
			for _, pt := range gp.Points {
				t.Rows = append(t.Rows, goodputRow{Rate: fmtRate(pt.Rate), P99: fmtDur(pt.TTFTP99), Errors: strconv.Itoa(pt.Errors), Met: pt.Met})
			}
			g.Trials = append(g.Trials, t)
		}
		bars[i] = b
	}
	ticks := niceTicks(top, 5)
	g.Chart = barChart("Goodput per policy", bars, ticks[len(ticks)-1], ticks,
		func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }, nil)
	return g
}

// niceTicks returns 0, step, … up to the first multiple of a 1-2-5 step at
// or above maxV, about n intervals; never fewer than two ticks.
func niceTicks(maxV float64, n int) []float64 {
	if !(maxV > 0) || !finite(maxV) {
		maxV = 1
	}
	raw := maxV / float64(n)
	e := math.Floor(math.Log10(raw))
	mult := 10.0
	for _, m := range []float64{1, 2, 5} {
		if m*math.Pow(10, e) >= raw {
			mult = m
			break
		}
	}
	// k·mult is an exact integer; scaling it once by a power of ten keeps
	// ticks such as 0.3 free of float noise.
	at := func(k int) float64 {
		if e < 0 {
			return float64(k) * mult / math.Pow(10, -e)
		}
		return float64(k) * mult * math.Pow(10, e)
	}
	count := 1
	for at(count) < maxV*(1-1e-9) {
		count++
	}
	ticks := make([]float64, 0, count+1)
	for k := 0; k <= count; k++ {
		ticks = append(ticks, at(k))
	}
	return ticks
}

// --- formatting ---

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// num formats an SVG coordinate; a non-finite value (which a bug upstream
// could produce) becomes 0 rather than breaking the image.
func num(v float64) string {
	if !finite(v) {
		v = 0
	}
	return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
}

func esc(s string) string { return template.HTMLEscapeString(s) }

func truncate(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func fmtPct(v float64) string {
	if !finite(v) {
		return "—"
	}
	return fmt.Sprintf("%.1f %%", 100*v)
}

func fmtRate(v float64) string {
	switch {
	case !finite(v):
		return "—"
	case v >= 100:
		return fmtThousands(int64(math.Round(v)))
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func fmtDur(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms < 1:
		return fmt.Sprintf("%.2f ms", ms)
	case ms < 10:
		return fmt.Sprintf("%.1f ms", ms)
	case ms < 1000:
		return fmt.Sprintf("%.0f ms", ms)
	case ms < 10_000:
		return fmt.Sprintf("%.2f s", ms/1000)
	case ms < 100_000:
		return fmt.Sprintf("%.1f s", ms/1000)
	}
	return fmt.Sprintf("%.0f s", ms/1000)
}

// msLabel labels a log-axis tick given in milliseconds.
func msLabel(ms float64) string {
	if ms >= 1000 {
		return strconv.FormatFloat(ms/1000, 'g', 3, 64) + " s"
	}
	return strconv.FormatFloat(ms, 'g', 3, 64) + " ms"
}

func fmtThousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteString(",")
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

var reportTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<style>
:root { color-scheme: light; }
* { print-color-adjust: exact; -webkit-print-color-adjust: exact; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
  color: #1d1d1f; background: #fff; max-width: 1160px; margin: 24px auto; padding: 0 24px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 32px 0 6px; padding-bottom: 4px; border-bottom: 1px solid #ddd; }
h3 { font-size: 14px; margin: 0; }
p { margin: 6px 0; }
.lede { font-size: 15px; color: #333; }
.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 12px 0; }
.facts dt { color: #666; }
.facts dd { margin: 0; }
.guide { background: #f6f7f9; border-left: 3px solid #9aa5b1; padding: 8px 12px; color: #333; }
.note { color: #555; font-size: 13px; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 8px; border-bottom: 1px solid #e6e6e6; text-align: right; white-space: nowrap; }
th { font-weight: 600; vertical-align: bottom; border-bottom: 2px solid #bbb; }
th small { display: block; font-weight: 400; color: #666; }
th.group { text-align: center; border-bottom: 1px solid #ccc; padding-bottom: 0; }
th.policy, td:first-child { text-align: left; }
td.best { font-weight: 700; background: #e2f3df; }
tr.kvroute td { background-color: #fcefef; }
tr.kvroute td.best { background: #d5ecd0; }
tr.kvroute td:first-child { font-weight: 700; box-shadow: inset 4px 0 0 #c81d25; }
.sw { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; vertical-align: baseline; }
figure { margin: 8px 0; }
figure svg { display: block; width: 100%; height: auto; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; font-size: 13px; margin: 6px 0; }
.multiples { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 16px 24px; }
.multiples svg { display: block; width: 100%; height: auto; }
.multiples .sub { font-size: 12px; color: #555; margin: 0 0 2px; }
.trials { display: flex; flex-wrap: wrap; gap: 16px 32px; margin-top: 8px; }
.trials td:first-child { text-align: right; }
.trials caption { text-align: left; font-weight: 600; padding-bottom: 4px; }
.met { color: #1b7a2e; }
.missed { color: #b3261e; }
footer { margin-top: 32px; color: #777; font-size: 12px; }
@media print {
  body { max-width: none; margin: 0; padding: 0; font-size: 11px; }
  h2 { break-after: avoid; }
  figure, table, .multiples > div, .trials > table { break-inside: avoid; }
}
@page { margin: 12mm; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
{{if .Description}}<p class="lede">{{.Description}}</p>{{end}}
<dl class="facts">{{range .Facts}}
<dt>{{.Label}}</dt><dd>{{.Value}}</dd>{{end}}
</dl>
<p class="guide">How to read this: every policy served the same requests on a fresh fleet with cold caches.
All times are model time (wall-clock time divided by the time scale): what the engine profile would take on real hardware.
Lower TTFT (time to first token), end-to-end latency and ITL (inter-token latency) are better.
The hit rate is cached prompt tokens / prompt tokens as the backends reported it in each reply's usage; the
bounds say how high any router could get. Load imbalance is the busiest backend's busy time over the mean
(1.00 is perfectly even). The best value of each column is highlighted.</p>

<h2>Summary</h2>
{{if .NoRuns}}<p class="note">No runs were recorded.</p>{{else}}
<div class="scroll"><table>
<thead><tr><th class="policy" rowspan="2">policy</th>{{range .Groups}}{{if eq .Span 1}}<th rowspan="2">{{.Name}}{{if .Unit}}<small>{{.Unit}}</small>{{end}}</th>{{else}}<th class="group" colspan="{{.Span}}">{{.Name}}</th>{{end}}{{end}}</tr>
<tr>{{range .SubHeads}}<th>{{.}}</th>{{end}}</tr></thead>
<tbody>{{range .Rows}}
<tr{{if .KVRoute}} class="kvroute"{{end}}><td><span class="sw" style="background:{{.Color}}"></span>{{.Policy}}</td>{{range .Cells}}<td{{if .Best}} class="best"{{end}}>{{.Text}}</td>{{end}}</tr>{{end}}
</tbody>
</table></div>{{end}}

<h2>Time to first token</h2>
<p class="note">Cumulative distribution over each policy's successful requests: a line further left and higher is better.
The x axis is logarithmic; the last few percent at the top are the tail that p99 measures.</p>
<figure>{{.CDF}}</figure>

<h2>Cache hit rate against the bounds</h2>
<p class="note">{{.HitNote}}</p>
<figure>{{.HitRate}}</figure>

<h2>Load per backend over time</h2>
<p class="note">Running + waiting requests on each backend, sampled in model time; every chart has the same axes.
Lines that stay together mean even load; one line far above the others is a hot spot.</p>
{{if .Backends}}<div class="legend">{{range .Backends}}<span><span class="sw" style="background:{{.Color}}"></span>{{.Name}}</span>{{end}}</div>{{end}}
{{if .Loads}}<div class="multiples">{{range .Loads}}
<div><h3><span class="sw" style="background:{{.Color}}"></span>{{.Policy}}</h3><p class="sub">{{.Subtitle}}</p>{{.Chart}}</div>{{end}}
</div>{{else}}<p class="note">No runs were recorded.</p>{{end}}
{{with .Goodput}}
<h2>Goodput</h2>
<p class="note">{{.Note}} Below it, the rates tried, in the order tried.</p>
<figure>{{.Chart}}</figure>
<div class="trials">{{range .Trials}}
<table>
<caption><span class="sw" style="background:{{.Color}}"></span>{{.Policy}} <small>(SLO p99 TTFT ≤ {{.SLO}})</small></caption>
<thead><tr><th>rate<small>req/s</small></th><th>TTFT p99</th><th>errors</th><th>SLO</th></tr></thead>
<tbody>{{range .Rows}}
<tr><td>{{.Rate}}</td><td>{{.P99}}</td><td>{{.Errors}}</td><td>{{if .Met}}<span class="met">✓ met</span>{{else}}<span class="missed">✗ missed</span>{{end}}</td></tr>{{else}}
<tr><td colspan="4">no rates tried</td></tr>{{end}}
</tbody>
</table>{{end}}
</div>{{end}}

<footer>Generated by kvroute bench. The per-request data behind this page is in results.json.</footer>
</body>
</html>
`))
