package emulator

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Histogram buckets in seconds, after vLLM's (vllm/v1/metrics/loggers.py),
// with a few finer buckets at the low end because a lone decode step takes
// about 7 ms.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets = []float64{0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075,
		0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	e2eBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
		40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// finishReasons are the request_success_total label values, as vLLM's.
var finishReasons = []string{"stop", "length", "abort"}

// metrics is a server's Prometheus registry, with vLLM's metric names so that
// scrapers written for vLLM work unchanged. Latencies are in model seconds.
type metrics struct {
	reg     *prometheus.Registry
	handler http.Handler
	ttft    prometheus.Histogram
	itl     prometheus.Histogram
	e2e     prometheus.Histogram
	success *prometheus.CounterVec
	// faults counts injected faults by name; not a vLLM metric.
	faults *prometheus.CounterVec
}

// newMetrics builds s's registry: vLLM's metrics and, from extra, any
// other collectors (the DCGM GPU metrics).
func newMetrics(s *Server, extra ...prometheus.Collector) *metrics {
	model := prometheus.Labels{"model_name": s.model}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: name, Help: help, Buckets: buckets, ConstLabels: model,
		})
	}
	m := &metrics{
		reg: prometheus.NewRegistry(),
		ttft: hist("vllm:time_to_first_token_seconds",
			"Histogram of time to first token in seconds (model time).", ttftBuckets),
		itl: hist("vllm:inter_token_latency_seconds",
			"Histogram of inter-token latency in seconds (model time).", itlBuckets),
		e2e: hist("vllm:e2e_request_latency_seconds",
			"Histogram of end-to-end request latency in seconds (model time).", e2eBuckets),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "vllm:request_success_total",
			Help:        "Count of finished requests, by finish reason.",
			ConstLabels: model,
		}, []string{"finished_reason"}),
	}
	m.faults = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "kvroute_emulator_faults_total",
		Help:        "Count of injected faults, by fault (emulator only, not a vLLM metric).",
		ConstLabels: model,
	}, []string{"fault"})
	for _, f := range faultNames {
		m.faults.WithLabelValues(f)
	}
	for _, r := range finishReasons {
		m.success.WithLabelValues(r) // export zeros before the first request
	}
	prefixCaching := "True" // as Python prints vLLM's config
	if s.profile.NoPrefixCaching {
		prefixCaching = "False"
	}
	cacheInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info",
		Help: "Information of the LLMEngine CacheConfig.",
		ConstLabels: prometheus.Labels{
			"model_name":            s.model,
			"block_size":            strconv.Itoa(s.profile.BlockSize),
			"num_gpu_blocks":        strconv.Itoa(s.profile.Blocks()),
			"enable_prefix_caching": prefixCaching,
		},
	})
	cacheInfo.Set(1)
	m.reg.MustRegister(m.ttft, m.itl, m.e2e, m.success, m.faults, cacheInfo, newEngineCollector(s))
	m.reg.MustRegister(extra...)
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	return m
}

// engineCollector exports the engine's queue lengths and counters, read from
// one engine.Stats snapshot per scrape.
type engineCollector struct {
	s                              *Server
	running, waiting, kv, kvLegacy *prometheus.Desc
	queries, hits, prompt, gen     *prometheus.Desc
	preemptions                    *prometheus.Desc
}

var _ prometheus.Collector = (*engineCollector)(nil)

func newEngineCollector(s *Server) *engineCollector {
	model := prometheus.Labels{"model_name": s.model}
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, model) }
	return &engineCollector{
		s:       s,
		running: d("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting: d("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kv:      d("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		// The name vLLM used before 0.10; older scrapers still read it.
		kvLegacy:    d("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage (deprecated name)."),
		queries:     d("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		hits:        d("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		prompt:      d("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		gen:         d("vllm:generation_tokens_total", "Number of generation tokens processed."),
		preemptions: d("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine."),
	}
}

// Describe implements prometheus.Collector.
func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.waiting, c.kv, c.kvLegacy,
		c.queries, c.hits, c.prompt, c.gen, c.preemptions} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge(c.running, float64(st.Running))
	gauge(c.waiting, float64(st.Waiting))
	gauge(c.kv, st.KVUsage)
	gauge(c.kvLegacy, st.KVUsage)
	counter(c.queries, st.PrefixQueries)
	counter(c.hits, st.PrefixHits)
	counter(c.prompt, st.PromptTokens)
	counter(c.gen, st.GenerationTokens)
	counter(c.preemptions, st.Preemptions)
}
