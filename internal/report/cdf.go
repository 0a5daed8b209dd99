package report

import (
	"fmt"
	"html/template"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/results"
)

// ttftCDF plots the distribution of TTFT of the successful requests, one
// line per policy, on a log time axis.
func ttftCDF(runs []results.Run, styles []policyStyle) template.HTML {
	const w = 960.0
	series, lo, hi := ttftSeries(runs)
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

	for _, i := range kvrouteLast(styles) {
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
	cdfLegend(s, styles, series, right, top)
	return s.done()
}

// ttftSeries returns each run's successful TTFTs in milliseconds, sorted,
// and the smallest positive and the largest of them all (+Inf and 0 when
// there are none).
func ttftSeries(runs []results.Run) (series [][]float64, lo, hi float64) {
	series = make([][]float64, len(runs))
	lo, hi = math.Inf(1), 0.0
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
	return series, lo, hi
}

// kvrouteLast returns the indexes of styles in drawing order: kvroute last,
// so it is drawn on top.
func kvrouteLast(styles []policyStyle) []int {
	order := make([]int, 0, len(styles))
	for i := range styles {
		if !styles[i].KVRoute {
			order = append(order, i)
		}
	}
	for i := range styles {
		if styles[i].KVRoute {
			order = append(order, i)
		}
	}
	return order
}

// cdfLegend draws one line and name per policy to the right of the plot,
// whose top right corner is (right, top).
func cdfLegend(s *svgDoc, styles []policyStyle, series [][]float64, right, top float64) {
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
