package proxy

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/upstream"
)

// Label values for requests that never reached a backend, and of the model
// label when the request named no model the fleet serves.
const noBackend = "none"

// statusClientClosed is the status label of a request whose client went away
// before the response was complete (nginx's 499).
const statusClientClosed = "499"

// metrics are the proxy's Prometheus metrics, all named kvroute_*.
type metrics struct {
	requests  *prometheus.CounterVec   // backend, status, reason, model
	ttft      *prometheus.HistogramVec // backend, model
	e2e       *prometheus.HistogramVec // backend, model
	predicted *prometheus.CounterVec   // backend
	reported  *prometheus.CounterVec   // backend
	prompt    *prometheus.CounterVec   // backend
	decision  prometheus.Histogram
	failures  *prometheus.CounterVec // backend, kind
	retries   *prometheus.CounterVec // backend, reason
	timeouts  *prometheus.CounterVec // backend, kind
	cut       *prometheus.CounterVec // backend, reason
	deadline  prometheus.Counter
	upstream  *prometheus.CounterVec // event: the lean path's connections (internal/upstream)
	// Migrations of cut streams (migrate.go).
	migrations   *prometheus.CounterVec // cause, outcome
	reprefilled  prometheus.Counter
	migrationGap prometheus.Histogram
}

// Buckets in seconds. TTFT runs from a cached short prompt (milliseconds) to
// a long prefill behind a queue (tens of seconds); a request from
// milliseconds to a long generation; a decision from microseconds up.
var (
	ttftBuckets     = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80}
	e2eBuckets      = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640}
	decisionBuckets = prometheus.ExponentialBuckets(1e-6, 4, 10) // 1 µs .. 262 ms
)

func newMetrics(reg prometheus.Registerer, f Fleet) (*metrics, error) {
	backend := []string{"backend"}
	counter := func(name, help string, labels []string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	hist := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets},
			[]string{"backend", "model"})
	}
	m := &metrics{
		requests: counter("kvroute_requests_total",
			`Requests answered, by backend ("none" if not routed), status ("499": the client went away), routing reason and model ("none" if the request named none the fleet serves).`,
			[]string{"backend", "status", "reason", "model"}),
		ttft: hist("kvroute_ttft_seconds",
			"Time from routing to the first content chunk (streams) or the first body byte, of successful requests, by backend and model.", ttftBuckets),
		e2e: hist("kvroute_e2e_seconds",
			"Time from routing to the end of the response, of successful requests, by backend and model.", e2eBuckets),
		predicted: counter("kvroute_predicted_cached_tokens_total",
			"Prompt tokens the policy expected the backend to have cached, over requests whose usage reported cached tokens.", backend),
		reported: counter("kvroute_reported_cached_tokens_total",
			"Cached prompt tokens the backends reported (usage.prompt_tokens_details.cached_tokens).", backend),
		prompt: counter("kvroute_prompt_tokens_total",
			"Prompt tokens the backends reported (usage.prompt_tokens).", backend),
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvroute_decision_seconds", Help: "Time the routing policy spent picking a backend.",
			Buckets: decisionBuckets,
		}),
		failures: counter("kvroute_backend_failures_total",
			`Attempts that failed at the backend, by kind: "dial" (connection refused; retried elsewhere), "request" (failed before a response), "read" (broke off mid-response).`,
			[]string{"backend", "kind"}),
		retries: counter("kvroute_retries_total",
			`Requests sent to another backend after this one failed before answering, by reason: "dial", "reset", "timeout" (no first token in time) or "status" (429, 502, 503, 504).`,
			[]string{"backend", "reason"}),
		timeouts: counter("kvroute_timeouts_total",
			`Attempts ended by a timeout, by kind: "first_token" (no first token by the deadline), "response" (a non-streamed response not answered by its deadline) or "idle" (a response stalled).`,
			[]string{"backend", "kind"}),
		cut: counter("kvroute_responses_cut_total",
			`Responses cut short after part of them reached the client, by reason: "read" (the backend failed), "first_token", "idle" or "shutdown". Streams end with an error event.`,
			[]string{"backend", "reason"}),
		upstream: upstream.NewConnCounter(),
		deadline: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_deadline_refused_total",
			Help: "Requests refused at once because the best backend's predicted time to first token missed their deadline."}),
		migrations: counter("kvroute_migrations_total",
			`Streams whose backend failed after their first bytes, sent on to another backend to continue, by cause ("reset", "idle", "error_event", "incomplete") and outcome ("continued", "finished": every allowed token was sent and kvroute wrote the end, "failed": that backend failed before its first token, "unsafe", "limit", "no_backend": the stream ended with the error event).`,
			[]string{"cause", "outcome"}),
		reprefilled: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_migration_prefill_tokens_total",
			Help: "Prompt tokens of the continuations sent (the original prompt and the text sent so far, as estimated), which their backends prefill again."}),
		migrationGap: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvroute_migration_gap_seconds",
			Help: "Time from a stream's cut to its continuation's first token reaching the client.", Buckets: ttftBuckets}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.ttft, m.e2e, m.predicted, m.reported,
		m.prompt, m.decision, m.failures, m.retries, m.timeouts, m.cut, m.deadline, m.upstream,
		m.migrations, m.reprefilled, m.migrationGap, newLoadCollector(f)} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("proxy: metrics already registered (one Proxy per registry): %w", err)
			}
			return nil, fmt.Errorf("proxy: register metrics: %w", err)
		}
	}
	for _, cause := range migrationCauses {
		for _, outcome := range migrationOutcomes {
			m.migrations.WithLabelValues(cause, outcome)
		}
	}
	// The backends known at start with the models they serve get their
	// latency series at once (empty until requests come), so that a
	// dashboard shows them before the first request. Backends and models
	// found later get theirs with their first request.
	for _, b := range f.Backends() {
		m.initSeries(b.Name)
		if info := b.Info(); info != nil {
			for _, model := range info.Models {
				m.ttft.WithLabelValues(b.Name, model)
				m.e2e.WithLabelValues(b.Name, model)
			}
		}
	}
	return m, nil
}

// Label values of the counters whose label sets are known in advance: each
// backend known at start gets every series at 0, so that rate() and alerts
// see them before the first failure (Prometheus's advice on missing series).
var (
	failureKinds = []string{"dial", "request", "status", "read"}
	retryReasons = []string{"dial", "reset", "timeout", "status", "held"}
	timeoutKinds = []string{"first_token", "response", "idle"}
	cutReasons   = []string{"read", "first_token", "idle", "shutdown"}
)

// initSeries creates backend's series of the counters at 0.
func (m *metrics) initSeries(backend string) {
	for _, c := range []*prometheus.CounterVec{m.predicted, m.reported, m.prompt} {
		c.WithLabelValues(backend)
	}
	for _, vals := range []struct {
		c      *prometheus.CounterVec
		labels []string
	}{{m.failures, failureKinds}, {m.retries, retryReasons}, {m.timeouts, timeoutKinds}, {m.cut, cutReasons}} {
		for _, l := range vals.labels {
			vals.c.WithLabelValues(backend, l)
		}
	}
}

// statusLabel is the requests_total label of an HTTP status.
func statusLabel(code int) string {
	if code >= 100 && code < 100+len(statusLabels) {
		return statusLabels[code-100] // strconv.Itoa would allocate one for every request
	}
	return strconv.Itoa(code)
}

// statusLabels are the labels of statuses 100 to 599.
var statusLabels = func() (l [500]string) {
	for i := range l {
		l[i] = strconv.Itoa(100 + i)
	}
	return l
}()

// modelLabel is the model label of a request for model: the model if some
// backend of the fleet serves it, else "none", so that clients cannot add
// series by naming models that do not exist.
func (p *Proxy) modelLabel(model string) string {
	if model == "" {
		return noBackend
	}
	for _, b := range p.fleet.Backends() {
		if info := b.Info(); info != nil && info.Serves(model) {
			return model
		}
	}
	return noBackend
}

// loadCollector exports the router's own in-flight accounting of every
// backend, read at scrape time from Backend.Load.
type loadCollector struct {
	fleet                     Fleet
	requests, prefill, decode *prometheus.Desc
}

var _ prometheus.Collector = (*loadCollector)(nil)

func newLoadCollector(f Fleet) *loadCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"backend"}, nil)
	}
	return &loadCollector{
		fleet:    f,
		requests: d("kvroute_inflight_requests", "Requests routed to the backend and not yet finished."),
		prefill: d("kvroute_inflight_prefill_tokens",
			"Uncached prompt tokens of the backend's requests that have not yet produced a first token."),
		decode: d("kvroute_inflight_decode_tokens",
			"Context tokens (prompt plus expected output) of the backend's requests in flight."),
	}
}

// Describe implements prometheus.Collector.
func (c *loadCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.requests
	ch <- c.prefill
	ch <- c.decode
}

// Collect implements prometheus.Collector.
func (c *loadCollector) Collect(ch chan<- prometheus.Metric) {
	for _, b := range c.fleet.Backends() {
		l := b.Load()
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.GaugeValue, float64(l.Requests), b.Name)
		ch <- prometheus.MustNewConstMetric(c.prefill, prometheus.GaugeValue, float64(l.PrefillTokens), b.Name)
		ch <- prometheus.MustNewConstMetric(c.decode, prometheus.GaugeValue, float64(l.DecodeTokens), b.Name)
	}
}
