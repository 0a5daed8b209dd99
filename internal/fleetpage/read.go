package fleetpage

import (
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/internal/fleet"
)

// gauges are the values the page shows as they are now, not per window.
type gauges struct {
	queued, inFlight float64
}

// read returns the counters the window keeps and the gauges, from the
// router's metrics (when the page has a Gatherer) and the backends'
// scrapes. It reads the metrics the proxy and the admission queue already
// keep, so that the page adds nothing to the request path for them.
func (p *Page) read(bs []*fleet.Backend) (counters, gauges) {
	c := counters{}
	var g gauges
	for _, b := range bs {
		if m := p.fleet.Metrics(b); m != nil && m.PrefixQueries > 0 {
			c[key{kind: kindEngineHits, a: b.Name}] = m.PrefixHits
			c[key{kind: kindEngineQuery, a: b.Name}] = m.PrefixQueries
		}
	}
	if p.gatherer == nil {
		return c, g
	}
	fams, _ := p.gatherer.Gather() // a collector's error leaves the others' families
	for _, mf := range fams {
		each := func(fn func(m *dto.Metric, v float64)) {
			for _, m := range mf.GetMetric() {
				fn(m, valueOf(m))
			}
		}
		switch mf.GetName() {
		case "kvroute_requests_total":
			each(func(m *dto.Metric, v float64) {
				if be := label(m, "backend"); be != "none" { // "none": answered without routing
					c[key{kindServed, be, label(m, "reason")}] += v
				}
			})
		case "kvroute_ttft_seconds":
			for _, m := range mf.GetMetric() {
				be := label(m, "backend")
				c[key{kind: kindTTFTSum, a: be}] += m.GetHistogram().GetSampleSum()
				c[key{kind: kindTTFTCount, a: be}] += float64(m.GetHistogram().GetSampleCount())
			}
		case "kvroute_prompt_tokens_total":
			each(func(m *dto.Metric, v float64) { c[key{kind: kindPrompt, a: label(m, "backend")}] += v })
		case "kvroute_reported_cached_tokens_total":
			each(func(m *dto.Metric, v float64) { c[key{kind: kindCached, a: label(m, "backend")}] += v })
		case "kvroute_retries_total":
			each(func(m *dto.Metric, v float64) { c[key{kind: kindRetries, a: label(m, "reason")}] += v })
		case "kvroute_migrations_total":
			each(func(m *dto.Metric, v float64) { c[key{kind: kindMigrations, a: label(m, "outcome")}] += v })
		case "kvroute_admission_rejected_total":
			each(func(m *dto.Metric, v float64) { c[key{kind: kindRejected, a: label(m, "reason")}] += v })
		case "kvroute_deadline_refused_total":
			each(func(_ *dto.Metric, v float64) { c[key{kind: kindRejected, a: "deadline_at_once"}] += v })
		case "kvroute_admission_queue_length":
			each(func(_ *dto.Metric, v float64) { g.queued += v })
		case "kvroute_admission_in_flight":
			each(func(_ *dto.Metric, v float64) { g.inFlight += v })
		}
	}
	return c, g
}

// valueOf is a counter's or a gauge's value.
func valueOf(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// label is m's value of the label name, "" if it has none.
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
