package router

import "github.com/prometheus/client_golang/prometheus"

// Collector exports the router's metrics: the scores of the policy's
// predictions (kvroute_prediction_*), response pinning when the router
// keeps pins (requests with a previous_response_id by what became of the
// pin, and the ids held), and the policy's own metrics when it is a
// prometheus.Collector.
func (r *Router) Collector() prometheus.Collector {
	cs := collectors{r.accuracy.ttft, r.accuracy.itl}
	if r.pins != nil {
		cs = append(cs, pinCollector{r.pins})
	}
	if c, ok := r.policy.(prometheus.Collector); ok {
		cs = append(cs, c)
	}
	return cs
}

// collectors gathers the Router's metrics: the prediction scores, response
// pins when the Router keeps them, and the policy's own when it has any.
type collectors []prometheus.Collector

// Describe implements prometheus.Collector.
func (cs collectors) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range cs {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (cs collectors) Collect(ch chan<- prometheus.Metric) {
	for _, c := range cs {
		c.Collect(ch)
	}
}
