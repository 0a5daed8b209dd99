package fleet

import "github.com/prometheus/client_golang/prometheus"

// The fleet's metrics. They are read from the backends' state at scrape
// time, so every backend and reason has a series from the start and the
// values cannot drift from what the router acts on.
var (
	upDesc = prometheus.NewDesc("kvroute_backend_up",
		"1 when the backend is in rotation: healthy and not ejected.", []string{"backend"}, nil)
	ejectedDesc = prometheus.NewDesc("kvroute_backend_ejected",
		"1 while outlier detection has the backend ejected.", []string{"backend"}, nil)
	ejectionsDesc = prometheus.NewDesc("kvroute_backend_ejections_total",
		"Outlier ejections, by reason: gateway, 5xx, timeout or slow (first tokens far slower than predicted).",
		[]string{"backend", "reason"}, nil)
	refusalsDesc = prometheus.NewDesc("kvroute_backend_ejections_refused_total",
		"Ejections refused because MaxEjectionPercent of the fleet was already ejected (once per failure streak).",
		[]string{"backend"}, nil)
)

// Collector returns a Prometheus collector of the fleet's metrics:
// kvroute_backend_up{backend}, kvroute_backend_ejected{backend},
// kvroute_backend_ejections_total{backend,reason} and
// kvroute_backend_ejections_refused_total{backend}. The caller registers it
// in the registry it serves (the proxy's, in kvroute serve), once. It is
// safe for concurrent use.
func (f *Fleet) Collector() prometheus.Collector { return fleetCollector{f} }

type fleetCollector struct{ f *Fleet }

var _ prometheus.Collector = fleetCollector{}

// Describe implements prometheus.Collector.
func (c fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- upDesc
	ch <- ejectedDesc
	ch <- ejectionsDesc
	ch <- refusalsDesc
}

// Collect implements prometheus.Collector.
func (c fleetCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.f.members() {
		name := m.b.Name
		ejected := m.out.ejected.Load()
		ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, bit(m.b.Healthy() && !ejected), name)
		ch <- prometheus.MustNewConstMetric(ejectedDesc, prometheus.GaugeValue, bit(ejected), name)
		for r := range numReasons {
			ch <- prometheus.MustNewConstMetric(ejectionsDesc, prometheus.CounterValue,
				float64(m.out.ejections[r].Load()), name, r.String())
		}
		ch <- prometheus.MustNewConstMetric(refusalsDesc, prometheus.CounterValue, float64(m.out.refusals.Load()), name)
	}
}

func bit(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
