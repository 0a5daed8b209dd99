package report

import (
	"fmt"
	"html/template"
	"slices"

	"github.com/kvroute/kvroute/internal/results"
)

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
