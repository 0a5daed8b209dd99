package report

import (
	"fmt"
	"html/template"
	"math"
	"strings"
)

// Chart limits keep the file small whatever the run size.
const (
	cdfPoints     = 150 // evenly spaced ranks per CDF line
	cdfTailPoints = 50  // extra ranks in the top 5 %, where p99 lives
	loadBuckets   = 150 // min and max of each: ≤ 300 points per backend
)

// Axis, grid and label colours shared by every chart.
const (
	axisColor = "#444"
	gridColor = "#e4e4e4"
	textColor = "#555"
)

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
