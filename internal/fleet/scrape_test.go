package fleet

import (
	"errors"
	"strings"
	"testing"
)

// Lines longer than the scraper's read buffer are kept or skipped whole.
func TestScraperLongLines(t *testing.T) {
	long := strings.Repeat("x", 40<<10)
	text := "# HELP " + long + "\n" +
		`unwanted_info{blob="` + long + `"} 1` + "\n" +
		`vllm:cache_config_info{block_size="32",blob="` + long + `",num_gpu_blocks="500"} 1` + "\n" +
		"vllm:num_requests_running 2\n"
	var s scraper
	for range 2 { // the second parse reuses the buffers
		m, cache, err := s.parse(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		if m.Running != 2 || cache != (cacheConfig{blockSize: 32, blocks: 500}) {
			t.Errorf("Running = %v, cache = %+v; want 2, {32 500}", m.Running, cache)
		}
	}
}

func TestScraperErrors(t *testing.T) {
	var s scraper
	if _, _, err := s.parse(strings.NewReader("vllm:kv_cache_usage_perc 0.5\n")); !errors.Is(err, ErrNoLoadMetrics) {
		t.Errorf("usage alone: error = %v, want ErrNoLoadMetrics", err)
	}
	if _, _, err := s.parse(strings.NewReader("vllm:num_requests_running{a=\"1\" 2\n")); err == nil {
		t.Error("malformed line parsed")
	}
	// The parser recovers from a bad scrape.
	if m, _, err := s.parse(strings.NewReader("sglang:num_queue_reqs 3\n")); err != nil || m.Waiting != 3 {
		t.Errorf("after an error: %+v, %v", m, err)
	}
}

func TestMetricName(t *testing.T) {
	tests := []struct{ line, want string }{
		{"vllm:num_requests_running{model_name=\"a\"} 1\n", "vllm:num_requests_running"},
		{"  llamacpp:requests_deferred 0\n", "llamacpp:requests_deferred"},
		{"llamacpp:requests_deferred\t0", "llamacpp:requests_deferred"},
		{"# TYPE vllm:num_requests_running gauge\n", ""},
		{"{\"vllm:num_requests_running\"} 1\n", ""},
		{"\n", ""},
		{"bare", "bare"},
	}
	for _, tt := range tests {
		if got := string(metricName([]byte(tt.line))); got != tt.want {
			t.Errorf("metricName(%q) = %q, want %q", tt.line, got, tt.want)
		}
	}
}
