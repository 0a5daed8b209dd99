package report

import (
	"fmt"
	"html/template"
	"slices"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/internal/results"
)

type swatch struct{ Name, Color string }

type loadPanel struct {
	Policy   string
	Color    string
	Subtitle string
	Chart    template.HTML
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
