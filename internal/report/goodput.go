package report

import (
	"fmt"
	"html/template"
	"slices"
	"strconv"

	"github.com/kvroute/kvroute/internal/results"
)

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
