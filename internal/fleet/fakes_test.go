package fleet

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeBackend is an inference server's probe surface: canned /health,
// /v1/models and /metrics, each with a settable status, and a count of the
// requests to each path that tests can wait on.
type fakeBackend struct {
	srv *httptest.Server

	mu            sync.Mutex
	healthStatus  int // 0 means 200
	modelsStatus  int
	metricsStatus int
	models        string
	metrics       string
	slots         string // "" answers 404, like a server without /slots
	hits          map[string]int
	// block, when set, is waited on by /health before it answers: a probe
	// held in flight.
	block chan struct{}
	// changed is poked (without blocking) as each request arrives.
	changed chan struct{}
}

func newFakeBackend(t *testing.T, models, metrics string) *fakeBackend {
	t.Helper()
	fb := &fakeBackend{
		models:  models,
		metrics: metrics,
		hits:    map[string]int{},
		changed: make(chan struct{}, 1),
	}
	fb.srv = httptest.NewServer(fb)
	t.Cleanup(fb.srv.Close)
	return fb
}

func (fb *fakeBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fb.mu.Lock()
	fb.hits[r.URL.Path]++
	var (
		status int
		body   string
		block  chan struct{}
	)
	switch r.URL.Path {
	case "/health":
		status, block = fb.healthStatus, fb.block
	case "/v1/models":
		status, body = fb.modelsStatus, fb.models
	case "/metrics":
		status, body = fb.metricsStatus, fb.metrics
	case "/slots":
		status, body = http.StatusNotFound, fb.slots
		if body != "" {
			status = http.StatusOK
		}
	default:
		status = http.StatusNotFound
	}
	fb.mu.Unlock()
	fb.poke() // the count changed: tell waiters now, not after a held answer

	if block != nil {
		<-block
	}
	if status == 0 {
		status = http.StatusOK
	}
	if r.URL.Path == "/metrics" {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

func (fb *fakeBackend) poke() {
	select {
	case fb.changed <- struct{}{}:
	default:
	}
}

func (fb *fakeBackend) set(fn func(fb *fakeBackend)) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fn(fb)
}

func (fb *fakeBackend) count(path string) int {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	return fb.hits[path]
}

// waitHits waits until path has had at least n requests. The deadline only
// turns a hang into a failure; nothing waits on time for state.
func (fb *fakeBackend) waitHits(t *testing.T, path string, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for fb.count(path) < n {
		select {
		case <-fb.changed:
		case <-deadline:
			t.Fatalf("%s: %d requests, want at least %d", path, fb.count(path), n)
		}
	}
}

func (fb *fakeBackend) backend(t *testing.T, index int, name string) *Backend {
	t.Helper()
	u, err := url.Parse(fb.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return NewBackend(index, name, u)
}

// fakeClock is an injected clock that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// logBuffer collects a test logger's output; safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// count returns how many records have message msg.
func (l *logBuffer) count(msg string) int {
	return strings.Count(l.String(), fmt.Sprintf("msg=%q", msg))
}

func newTestLogger() (*slog.Logger, *logBuffer) {
	buf := &logBuffer{}
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// Canned /v1/models answers.
const (
	vllmModels = `{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model",` +
		`"created":1748779200,"owned_by":"vllm","root":"meta-llama/Llama-3.1-8B-Instruct","parent":null,` +
		`"max_model_len":131072,"permission":[{"id":"modelperm-1","object":"model_permission",` +
		`"created":1748779200,"allow_sampling":true,"organization":"*","is_blocking":false}]},` +
		`{"id":"sql-lora","object":"model","created":1748779200,"owned_by":"vllm",` +
		`"root":"/adapters/sql-lora","parent":"meta-llama/Llama-3.1-8B-Instruct","max_model_len":null}]}`
	sglangModels = `{"object":"list","data":[{"id":"Qwen/Qwen2.5-7B-Instruct","object":"model",` +
		`"created":1748779200,"owned_by":"sglang","root":"Qwen/Qwen2.5-7B-Instruct","max_model_len":32768}]}`
	llamacppModels = `{"models":[{"name":"qwen2.5-7b-instruct-q4_k_m.gguf","model":"qwen2.5-7b-instruct-q4_k_m.gguf",` +
		`"modified_at":"","size":"","digest":"","type":"model","description":"","tags":[""],` +
		`"capabilities":["completion"],"parameters":"","details":{"format":"gguf"}}],"object":"list",` +
		`"data":[{"id":"qwen2.5-7b-instruct-q4_k_m.gguf","object":"model","created":1748779200,` +
		`"owned_by":"llamacpp","meta":{"vocab_type":2,"n_vocab":152064,"n_ctx_train":32768,` +
		`"n_embd":3584,"n_params":7615616512,"size":4677120000}}]}`
)

// vllmTTFTHistogram is one of the many histograms vLLM exposes: the bulk of
// its /metrics, and nothing the scraper reads.
const vllmTTFTHistogram = `# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 412.70231
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.005",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",model_name="meta-llama/Llama-3.1-8B-Instruct"} 97.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="meta-llama/Llama-3.1-8B-Instruct"} 811.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.06",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1502.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.08",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2044.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2390.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.25",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3310.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3620.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3701.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="2.5",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3712.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="5.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3712.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3712.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3712.0
`

// vllmMetrics is a vLLM V1 /metrics as prometheus_client renders it: process
// and GC metrics, gauges, counters with their _created companions,
// histograms, and the cache_config_info gauge whose labels carry the KV
// cache shape.
const vllmMetrics = `# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 18230.0
python_gc_objects_collected_total{generation="1"} 4102.0
python_gc_objects_collected_total{generation="2"} 311.0
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 3.1415e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.4375
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.048576e+06
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7487792e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 393216.0
# HELP vllm:prefix_cache_hits_created Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_created gauge
vllm:prefix_cache_hits_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7487792e+09
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.048576e+06
` + vllmTTFTHistogram + `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="27306",num_gpu_blocks_override="None",prefix_caching_hash_algo="builtin",sliding_window="None",swap_space="4",swap_space_bytes="4294967296"} 1.0
`

// vllmDPMetrics is vLLM with two data-parallel engines behind one API
// server: every series comes twice, with engine="0" and engine="1".
const vllmDPMetrics = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 5.0
vllm:num_requests_running{engine="1",model_name="m"} 7.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 3000.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 300.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1.0
`

// vllmV0Metrics is an older vLLM (V0 engine, before 0.10): the KV gauge is
// gpu_cache_usage_perc and there are no prefix-cache token counters.
const vllmV0Metrics = `# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-2-7b-hf"} 4.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="meta-llama/Llama-2-7b-hf"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-2-7b-hf"} 9.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Llama-2-7b-hf"} 0.9921875
# HELP vllm:gpu_prefix_cache_hit_rate GPU prefix cache block hit rate.
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{model_name="meta-llama/Llama-2-7b-hf"} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="2048",num_gpu_blocks="7412",num_gpu_blocks_override="None",sliding_window="None",swap_space_bytes="4294967296"} 1.0
`

// sglangMetrics is SGLang with --enable-metrics: scheduler gauges per
// tp/pp rank, tokenizer counters, cached tokens split by cache_source.
const sglangMetrics = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"} 7.0
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"} 88211.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"} 0.55
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"} 412.6
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"} 4.0
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"} 0.31
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="Qwen/Qwen2.5-7B-Instruct"} 200000.0
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="Qwen/Qwen2.5-7B-Instruct"} 51200.0
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="Qwen/Qwen2.5-7B-Instruct"} 50000.0
sglang:cached_tokens_total{cache_source="host",model_name="Qwen/Qwen2.5-7B-Instruct"} 10000.0
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{model_name="Qwen/Qwen2.5-7B-Instruct"} 301.25
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="Qwen/Qwen2.5-7B-Instruct"} 1200.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="Qwen/Qwen2.5-7B-Instruct"} 1500.0
sglang:time_to_first_token_seconds_count{model_name="Qwen/Qwen2.5-7B-Instruct"} 1500.0
`

// llamacppMetrics is an older llama-server --metrics, which still had the
// KV cache gauges. llama-server prints integers without a decimal point and
// no labels.
const llamacppMetrics = `# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 33065
# HELP llamacpp:prompt_seconds_total Prompt process time
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 235.743
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 7801
# HELP llamacpp:tokens_predicted_seconds_total Predict process time
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 171.521
# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 7560
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode counter
llamacpp:n_busy_slots_per_decode 1.03
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 140.26
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 45.48
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
# HELP llamacpp:kv_cache_tokens KV-cache tokens.
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 4096
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
`

// llamacppNewMetrics is a current llama-server: the KV cache gauges are gone.
const llamacppNewMetrics = `# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 120
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 64
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode counter
llamacpp:n_busy_slots_per_decode 1
`

// llamacppCachedMetrics is the llama-server of node-llama-cpp 3.21.1, which
// counts cached prompt tokens apart from computed ones.
const llamacppCachedMetrics = `# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1200
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 800
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 1.25
# HELP llamacpp:tokens_predicted_seconds_total Total time spent generating tokens
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 2.25
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
`
