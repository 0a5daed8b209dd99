package fleet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// maxMetricsBody bounds a /metrics response, in bytes. vLLM's is tens of
// kilobytes; this leaves room for many models and label sets.
const maxMetricsBody = 16 << 20

// acceptText asks for the Prometheus text format, the one every engine
// serves and the one we parse.
const acceptText = "text/plain;version=0.0.4;q=1,*/*;q=0.1"

// The metric names understood, per signal, in order of preference: vLLM
// (V1, then the pre-0.10 KV name), SGLang, llama.cpp. A server exposes one
// engine's names, so the first present wins and names are never mixed.
var (
	runningNames = []string{"vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing"}
	waitingNames = []string{"vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred"}
	// KV usage as a fraction of the cache. llama.cpp dropped its gauge when
	// its KV cache was unified; newer builds report none.
	kvUsageNames = []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
		"llamacpp:kv_cache_usage_ratio"}
	// Cumulative prefix-cache counters in tokens, as (hits, queries) pairs.
	// SGLang counts cached prompt tokens (summed over its cache_source
	// label: device, host, storage) against all prompt tokens.
	prefixNames = [][2]string{
		{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"},
		{"sglang:cached_tokens_total", "sglang:prompt_tokens_total"},
	}
	// llama.cpp counts the prompt tokens it computed and those it reused
	// apart: the queries are their sum.
	llamaComputedName, llamaCachedName = "llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"
	// llama.cpp's compute time in seconds, prompt and generation, each
	// summed over its slots.
	busyNames = []string{"llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total"}
	// llamaName marks a llama.cpp server, which has /slots to read too.
	llamaName       = "llamacpp:requests_processing"
	cacheConfigName = "vllm:cache_config_info"
	// NVIDIA's DCGM exporter: utilisation in percent, SM activity as a
	// ratio, per GPU (averaged over a backend's tensor-parallel GPUs).
	gpuUtilName, smActiveName = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE"
)

// wanted is every name above: the only lines of a scrape worth parsing.
var wanted = func() map[string]bool {
	w := map[string]bool{cacheConfigName: true, llamaComputedName: true, llamaCachedName: true,
		gpuUtilName: true, smActiveName: true, loraInfoName: true}
	for _, names := range [][]string{runningNames, waitingNames, kvUsageNames, busyNames} {
		for _, n := range names {
			w[n] = true
		}
	}
	for _, p := range prefixNames {
		w[p[0]], w[p[1]] = true, true
	}
	return w
}()

// cacheConfig is a backend's KV cache shape from vllm:cache_config_info.
type cacheConfig struct {
	blockSize, blocks int
}

// scraper parses one backend's /metrics. Its buffers are reused from scrape
// to scrape; it is not safe for concurrent use (member.scrapeMu guards it).
//
// A vLLM exposition is mostly histogram buckets (tens of kilobytes, hundreds
// of series), and expfmt turns every series into several protobuf
// allocations. So the scraper first keeps only the sample lines of the few
// metrics it reads, in a reused buffer, and lets expfmt parse just those:
// scraping often then costs little more than reading the bytes.
type scraper struct {
	in     *bufio.Reader
	kept   bytes.Buffer
	rd     bytes.Reader
	parser expfmt.TextParser
	ready  bool
	// llama is set when the last parse found llama.cpp's metrics.
	llama bool
	// engine, when set, keeps only the series of that data-parallel
	// engine (rank.go); engines is how many the last parse found.
	engine  string
	engines int
}

// scrape reads m's /metrics and stores its load signals with At = now, and
// its KV cache shape when it has one. A failed scrape leaves the old metrics
// to go stale; it never marks m down (health checks do that). Failures are
// logged once until a scrape works again.
func (f *Fleet) scrape(ctx context.Context, m *member) {
	m.scrapeMu.Lock()
	defer m.scrapeMu.Unlock()
	var (
		met   *Metrics
		cache cacheConfig
	)
	err := f.fetch(ctx, m.b, m.metricsURL, acceptText, maxMetricsBody, func(r io.Reader) error {
		var err error
		met, cache, err = m.scraper.parse(r)
		return err
	})
	if err == nil && m.scraper.llama {
		f.scrapeSlots(ctx, m, met)
	}
	if err == nil && m.b.GPUMetricsURL != nil {
		f.scrapeGPU(ctx, m, met)
	}
	if ctx.Err() != nil {
		return
	}
	b := m.b
	if err != nil {
		if !m.scrapeFailing {
			m.scrapeFailing = true
			f.log.Warn("backend scrape failed", "backend", b.Name, "url", m.base, "err", err)
		}
		return
	}
	if m.scrapeFailing {
		m.scrapeFailing = false
		f.log.Info("backend scrape recovered", "backend", b.Name, "url", m.base)
	}
	met.At = f.now()
	b.SetMetrics(met)
	if cache.blockSize > 0 && cache.blocks > 0 {
		m.setCache(cache)
	}
	f.noteEngines(m, m.scraper.engines) // rank.go
}

// parse reads a Prometheus text exposition and returns the load signals in
// it, summed over label sets (fractions averaged), and the KV cache shape
// (zero when absent). It fails with ErrNoLoadMetrics when the text has
// neither a running nor a waiting count.
func (s *scraper) parse(r io.Reader) (*Metrics, cacheConfig, error) {
	if err := s.filter(r); err != nil {
		return nil, cacheConfig{}, err
	}
	if !s.ready {
		// The zero TextParser has no name validation scheme and panics on
		// the first name; UTF-8 accepts vLLM's colons and anything else.
		s.parser = expfmt.NewTextParser(model.UTF8Validation)
		s.ready = true
	}
	s.rd.Reset(s.kept.Bytes())
	fams, err := s.parser.TextToMetricFamilies(&s.rd)
	if err != nil {
		return nil, cacheConfig{}, err
	}
	s.engines = engineCount(fams[runningNames[0]])
	engineOnly(fams, s.engine)

	met := &Metrics{KVUsage: -1}
	met.GPUUtil, met.SMActive = gpuSignals(fams, "")
	running, okR := first(fams, runningNames, sum)
	waiting, okW := first(fams, waitingNames, sum)
	if !okR && !okW {
		return nil, cacheConfig{}, ErrNoLoadMetrics
	}
	met.Running, met.Waiting = running, waiting
	if kv, ok := first(fams, kvUsageNames, mean); ok {
		met.KVUsage = min(max(kv, 0), 1)
	}
	for _, p := range prefixNames {
		hits, okH := sum(fams[p[0]])
		queries, okQ := sum(fams[p[1]])
		if okH && okQ {
			met.PrefixHits, met.PrefixQueries = hits, queries
			break
		}
	}
	// Builds older than the cached counter count computed tokens only: no
	// hit rate can be told from that.
	computed, okP := sum(fams[llamaComputedName])
	if cached, okC := sum(fams[llamaCachedName]); okP && okC {
		met.PrefixHits, met.PrefixQueries = cached, computed+cached
	}
	for _, n := range busyNames {
		if v, ok := sum(fams[n]); ok {
			met.BusySeconds += v
		}
	}
	met.LoRA = loraInfo(fams[loraInfoName])
	_, s.llama = fams[llamaName]
	return met, cacheShape(fams[cacheConfigName]), nil
}

// gpuSignals returns the GPU utilisation and SM activity in a DCGM
// exposition, as fractions averaged over the GPUs, -1 when absent. A
// non-empty pod keeps only the GPUs the exporter maps to that Kubernetes
// pod (its pod label), for an exporter that serves a whole node.
func gpuSignals(fams map[string]*dto.MetricFamily, pod string) (util, sm float64) {
	util, sm = -1, -1
	if v, ok := mean(podOnly(fams[gpuUtilName], pod)); ok {
		util = min(max(v/100, 0), 1)
	}
	if v, ok := mean(podOnly(fams[smActiveName], pod)); ok {
		sm = min(max(v, 0), 1)
	}
	return util, sm
}

// podOnly returns mf with only the samples labelled pod=pod; mf itself when
// pod is empty.
func podOnly(mf *dto.MetricFamily, pod string) *dto.MetricFamily {
	if pod == "" || mf == nil {
		return mf
	}
	kept := &dto.MetricFamily{}
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "pod" && l.GetValue() == pod {
				kept.Metric = append(kept.Metric, m)
				break
			}
		}
	}
	return kept
}

// parseGPU reads a GPU exporter's exposition (a backend's GPUMetricsURL)
// and returns its GPU signals, -1 each when absent.
func (s *scraper) parseGPU(r io.Reader, pod string) (util, sm float64, err error) {
	if err := s.filter(r); err != nil {
		return -1, -1, err
	}
	if !s.ready {
		s.parser = expfmt.NewTextParser(model.UTF8Validation)
		s.ready = true
	}
	s.rd.Reset(s.kept.Bytes())
	fams, err := s.parser.TextToMetricFamilies(&s.rd)
	if err != nil {
		return -1, -1, err
	}
	util, sm = gpuSignals(fams, pod)
	return util, sm, nil
}

// filter copies to s.kept the sample lines of wanted metrics from r,
// dropping comments and everything else.
func (s *scraper) filter(r io.Reader) error {
	if s.in == nil {
		s.in = bufio.NewReaderSize(r, 16<<10)
	} else {
		s.in.Reset(r)
	}
	defer s.in.Reset(nil) // don't hold on to the response body
	s.kept.Reset()
	for {
		line, err := s.in.ReadSlice('\n')
		keep := wanted[string(metricName(line))]
		if keep {
			s.kept.Write(line)
		}
		for errors.Is(err, bufio.ErrBufferFull) { // a line longer than the buffer
			line, err = s.in.ReadSlice('\n')
			if keep {
				s.kept.Write(line)
			}
		}
		if err == io.EOF {
			if k := s.kept.Bytes(); len(k) > 0 && k[len(k)-1] != '\n' {
				s.kept.WriteByte('\n') // the parser wants whole lines
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// metricName returns the metric name a sample line starts with; nothing for
// comments, blank lines and quoted (UTF-8) names, none of which we want.
func metricName(line []byte) []byte {
	i := 0
	for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
		i++
	}
	line = line[i:]
	for j, c := range line {
		switch c {
		case '{', ' ', '\t', '\n', '\r', '#', '"':
			return line[:j]
		}
	}
	return line
}

// first applies agg to the first family of names present.
func first(fams map[string]*dto.MetricFamily, names []string, agg func(*dto.MetricFamily) (float64, bool)) (float64, bool) {
	for _, n := range names {
		if v, ok := agg(fams[n]); ok {
			return v, true
		}
	}
	return 0, false
}

// sum adds up a family's finite sample values over its label sets: several
// models on one server, or several engines behind one vLLM API server.
func sum(mf *dto.MetricFamily) (float64, bool) {
	var (
		total float64
		n     int
	)
	for _, m := range mf.GetMetric() {
		if v, ok := value(m); ok {
			total += v
			n++
		}
	}
	return total, n > 0
}

// mean averages a family's finite sample values over its label sets: the
// right way to combine fractions such as KV usage (two data-parallel engines
// at 60 % are a server at 60 %, not 120 %).
func mean(mf *dto.MetricFamily) (float64, bool) {
	total, ok := sum(mf)
	if !ok {
		return 0, false
	}
	n := 0
	for _, m := range mf.GetMetric() {
		if _, ok := value(m); ok {
			n++
		}
	}
	return total / float64(n), true
}

// value is a sample's value, whatever its declared type; false when it has
// none or it is NaN or infinite.
func value(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// cacheShape reads block_size and num_gpu_blocks from the labels of
// vllm:cache_config_info. With several engines (data parallel), each has its
// own cache: their blocks add up. Labels that aren't numbers (vLLM says
// "None" before profiling) count as absent.
func cacheShape(mf *dto.MetricFamily) cacheConfig {
	var c cacheConfig
	for _, m := range mf.GetMetric() {
		var bs, nb int
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "block_size":
				bs, _ = strconv.Atoi(l.GetValue())
			case "num_gpu_blocks":
				nb, _ = strconv.Atoi(l.GetValue())
			}
		}
		if bs > 0 && nb > 0 {
			c.blockSize = bs
			c.blocks += nb
		}
	}
	return c
}

// scrapeGPU reads the GPU signals of m from its GPU exporter's URL into
// met, where the backend's own /metrics had none. A failure leaves them
// absent (-1) and is logged once until a scrape works again.
func (f *Fleet) scrapeGPU(ctx context.Context, m *member, met *Metrics) {
	b := m.b
	// An exporter of its own: the backend's API key is not sent there.
	err := f.fetch(ctx, &Backend{}, b.GPUMetricsURL.String(), acceptText, maxMetricsBody, func(r io.Reader) error {
		util, sm, err := m.scraper.parseGPU(r, b.GPUPod)
		if err == nil {
			if met.GPUUtil < 0 {
				met.GPUUtil = util
			}
			if met.SMActive < 0 {
				met.SMActive = sm
			}
		}
		return err
	})
	switch {
	case err != nil && !m.gpuFailing && ctx.Err() == nil:
		m.gpuFailing = true
		f.log.Warn("backend GPU metrics scrape failed", "backend", b.Name, "url", b.GPUMetricsURL.String(), "err", err)
	case err == nil && m.gpuFailing:
		m.gpuFailing = false
		f.log.Info("backend GPU metrics scrape recovered", "backend", b.Name)
	}
}
