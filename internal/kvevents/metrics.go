package kvevents

import "github.com/prometheus/client_golang/prometheus"

var _ prometheus.Collector = (*Metrics)(nil)

// Metrics are the subscribers' counters, by backend name: a
// prometheus.Collector to register or serve beside others. A nil *Metrics
// counts nothing.
type Metrics struct {
	batches  *prometheus.CounterVec
	events   *prometheus.CounterVec
	gaps     *prometheus.CounterVec
	replayed *prometheus.CounterVec
	resets   *prometheus.CounterVec
	probes   *prometheus.CounterVec
	lag      *prometheus.GaugeVec
	state    *prometheus.GaugeVec
	blocks   *prometheus.GaugeVec
	all      []prometheus.Collector
}

// NewMetrics returns the subscribers' metrics, zero.
func NewMetrics() *Metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append([]string{"backend"}, labels...))
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, append([]string{"backend"}, labels...))
	}
	m := &Metrics{
		batches:  counter("kvroute_kv_event_batches_total", "KV event batches received from the backend's engine (live and replayed)."),
		events:   counter("kvroute_kv_events_total", "KV events received, by type (BlockStored, BlockRemoved, AllBlocksCleared).", "type"),
		gaps:     counter("kvroute_kv_event_gaps_total", "Missed sequence numbers detected on the backend's KV event stream."),
		replayed: counter("kvroute_kv_event_replayed_total", "KV event batches recovered from the backend's replay socket."),
		resets:   counter("kvroute_kv_event_resets_total", "Times the backend's block state was dropped, by reason (connect, restart, gap).", "reason"),
		probes:   counter("kvroute_kv_event_probes_total", "Replay requests after a quiet spell (--kv-events-probe), by result: current (nothing missed), recovered (lost batches replayed), gap (the replay had a hole: state reset to partial), failed (the replay did not answer).", "result"),
		lag:      gauge("kvroute_kv_event_lag_seconds", "Seconds between the engine publishing the latest batch and the router applying it."),
		state:    gauge("kvroute_kv_event_state", "How far the backend's block state is trusted: 0 unknown (the index decides), 1 partial, 2 exact."),
		blocks:   gauge("kvroute_kv_event_blocks", "Blocks the backend's engine holds, by medium, as its events say.", "medium"),
	}
	m.all = []prometheus.Collector{m.batches, m.events, m.gaps, m.replayed, m.resets, m.probes, m.lag, m.state, m.blocks}
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.all {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.all {
		c.Collect(ch)
	}
}

func (m *Metrics) batch(backend string, b *Batch, lag float64, replayed bool) {
	if m == nil {
		return
	}
	m.batches.WithLabelValues(backend).Inc()
	if replayed {
		m.replayed.WithLabelValues(backend).Inc()
	}
	for i := range b.Events {
		m.events.WithLabelValues(backend, b.Events[i].Kind.String()).Inc()
	}
	m.lag.WithLabelValues(backend).Set(lag)
}

func (m *Metrics) gap(backend string, missed int64) {
	if m != nil {
		m.gaps.WithLabelValues(backend).Add(float64(missed))
	}
}

func (m *Metrics) reset(backend, reason string) {
	if m != nil {
		m.resets.WithLabelValues(backend, reason).Inc()
	}
}

func (m *Metrics) probe(backend, result string) {
	if m != nil {
		m.probes.WithLabelValues(backend, result).Inc()
	}
}

func (m *Metrics) status(backend string, st State, gpu, cpu int) {
	if m == nil {
		return
	}
	m.state.WithLabelValues(backend).Set(float64(st))
	m.blocks.WithLabelValues(backend, MediumGPU).Set(float64(gpu))
	m.blocks.WithLabelValues(backend, MediumCPU).Set(float64(cpu))
}

// Forget drops the series of a backend that left the fleet.
func (m *Metrics) Forget(backend string) {
	if m == nil {
		return
	}
	for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{m.batches, m.events, m.gaps, m.replayed, m.resets, m.probes, m.lag, m.state, m.blocks} {
		v.DeletePartialMatch(prometheus.Labels{"backend": backend})
	}
}
