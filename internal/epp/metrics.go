package epp

import "github.com/prometheus/client_golang/prometheus"

// metrics are the picker's own (kvroute_epp_*); the admission queue's are
// kvroute_admission_*.
type metrics struct {
	requests       *prometheus.CounterVec
	streams        prometheus.Gauge
	decision       prometheus.Histogram
	prompt, cached prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_epp_requests_total",
			Help: "Requests by what the picker did: routed, by_load, by_response (a stored response's, to its endpoint), refused (429), no_endpoint (503), bad_request, too_large, error; " +
				"and how routed ones ended early: served_by_fallback, cut."}, []string{"outcome"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_epp_streams",
			Help: "ext_proc streams open: requests between their headers and their response's end."}),
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvroute_epp_decision_seconds",
			Help: "Time the policy took to pick an endpoint.", Buckets: prometheus.ExponentialBuckets(1e-6, 4, 10)}),
		prompt: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_epp_prompt_tokens_total",
			Help: "Prompt tokens of routed requests whose response reported cached tokens."}),
		cached: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_epp_cached_tokens_total",
			Help: "Cached prompt tokens the endpoints reported: over kvroute_epp_prompt_tokens_total, the prompt-cache hit rate."}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.streams, m.decision, m.prompt, m.cached)
	}
	return m
}
