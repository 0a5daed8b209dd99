package calibrate

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"
)

var _ prometheus.Collector = (*Accuracy)(nil)

// accuracyDescs are one Accuracy's metrics. The kind is a constant label,
// so that the Accuracy of each kind of prediction registers as a collector
// of its own beside the others.
type accuracyDescs struct {
	ratio, coverage, ape *prometheus.Desc
}

func newAccuracyDescs(kind string) accuracyDescs {
	kl := prometheus.Labels{"kind": kind}
	backend := []string{"backend"}
	return accuracyDescs{
		ratio: prometheus.NewDesc("kvroute_prediction_ratio",
			"Observed over predicted latency, by backend and kind of prediction (ttft, itl); the series without a backend label is the fleet's.",
			backend, kl),
		coverage: prometheus.NewDesc("kvroute_prediction_coverage_ratio",
			"Share of observed latencies inside the predicted interval (80 % by default) since the warm-up, by backend; the series without a backend label is the fleet's.",
			backend, kl),
		ape: prometheus.NewDesc("kvroute_prediction_ape_median",
			"Median absolute percentage error of the predicted latency since the warm-up, as a fraction (0.1 is 10 %), by backend; the series without a backend label is the fleet's.",
			backend, kl),
	}
}

// Describe implements prometheus.Collector.
func (a *Accuracy) Describe(ch chan<- *prometheus.Desc) {
	ch <- a.descs.ratio
	ch <- a.descs.coverage
	ch <- a.descs.ape
}

// Collect implements prometheus.Collector: a series per named backend
// (SetName) and the fleet's, with an empty backend label. The gauges are
// absent until there are observations after the warm-up.
func (a *Accuracy) Collect(ch chan<- prometheus.Metric) {
	s := a.Snapshot()
	a.collect(ch, "", s.Fleet)
	for _, b := range s.Backends {
		if b.Name != "" {
			a.collect(ch, b.Name, b)
		}
	}
}

func (a *Accuracy) collect(ch chan<- prometheus.Metric, label string, s Stats) {
	buckets := make(map[float64]uint64, len(RatioBuckets))
	for k, le := range RatioBuckets {
		buckets[le] = s.Ratio[k]
	}
	ch <- prometheus.MustNewConstHistogram(a.descs.ratio, s.Count, s.RatioSum, buckets, label)
	if !math.IsNaN(s.Coverage) {
		ch <- prometheus.MustNewConstMetric(a.descs.coverage, prometheus.GaugeValue, s.Coverage, label)
	}
	if !math.IsNaN(s.MedianAPE) {
		ch <- prometheus.MustNewConstMetric(a.descs.ape, prometheus.GaugeValue, s.MedianAPE, label)
	}
}
