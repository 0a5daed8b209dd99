package emulator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/internal/engine"
)

// fakeClock is a Clock whose time moves only when the driver sleeps: After(d)
// advances it by d at once. Model time is then a function of the requests
// alone, however fast or loaded the machine is.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	c.now = c.now.Add(d)
	t := c.now
	c.mu.Unlock()
	ch := make(chan time.Time, 1)
	ch <- t
	return ch
}

const testModel = "test-model"

// testProfile is the default profile; tweak adjusts it.
func testProfile(t testing.TB, tweak func(*engine.Profile)) engine.Profile {
	t.Helper()
	p, err := engine.LookupProfile(engine.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		tweak(&p)
	}
	return p
}

// startServer runs an emulator behind httptest.NewServer until the test
// ends. A nil cfg.Clock gets a fakeClock; wrap, if not nil, wraps the handler.
func startServer(t testing.TB, cfg Config, wrap func(http.Handler) http.Handler) (*Server, string) {
	t.Helper()
	if cfg.Model == "" {
		cfg.Model = testModel
	}
	if cfg.Profile.Name == "" {
		cfg.Profile = testProfile(t, nil)
	}
	if cfg.Clock == nil {
		cfg.Clock = newFakeClock()
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var h http.Handler = s
	if wrap != nil {
		h = wrap(h)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		ts.Close()
	})
	return s, ts.URL
}

// post sends body (a string or a value to encode) and returns the response
// with its body read.
func post(t *testing.T, url string, body any) (*http.Response, []byte) {
	t.Helper()
	var data []byte
	switch b := body.(type) {
	case string:
		data = []byte(b)
	default:
		var err error
		if data, err = json.Marshal(b); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, got
}

// Client-side views of the responses, as an OpenAI SDK decodes them.
type (
	usageJSON struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	responseJSON struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Choices []struct {
			Index   int `json:"index"`
			Message *struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			Delta *struct {
				Role    *string `json:"role"`
				Content *string `json:"content"`
			} `json:"delta"`
			Text         *string `json:"text"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *usageJSON `json:"usage"`
	}
	errorJSON struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
)

// complete posts a non-streaming request that must succeed.
func complete(t *testing.T, url string, body any) (responseJSON, http.Header) {
	t.Helper()
	resp, data := post(t, url, body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	var r responseJSON
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
	if len(r.Choices) != 1 || r.Usage == nil || r.Usage.PromptTokensDetails == nil {
		t.Fatalf("want one choice and usage with prompt_tokens_details, got %s", data)
	}
	return r, resp.Header
}

// readEvents reads a server-sent event stream and returns the data payloads.
func readEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var events []string
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("line %q is not a data line", line)
		}
		events = append(events, data)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return events
}

// stream posts a streaming request and returns its events and the response
// (trailers included).
func stream(t *testing.T, url string, body any) ([]string, *http.Response) {
	t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("Content-Type %q", ct)
	}
	return readEvents(t, resp.Body), resp
}

// scrape reads a server's /metrics with the Prometheus text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// metricValue returns the value of the only sample of a gauge or counter, or
// the count of a histogram.
func metricValue(t *testing.T, fams map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil || len(f.GetMetric()) != 1 {
		t.Fatalf("metric %s: want one sample, got %v", name, f)
	}
	m := f.GetMetric()[0]
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	t.Fatalf("metric %s has no value", name)
	return 0
}

// headerSeconds parses a model-time header.
func headerSeconds(t *testing.T, h http.Header, name string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(h.Get(name), 64)
	if err != nil {
		t.Fatalf("header %s: %v", name, err)
	}
	return v
}

// words returns n words of English-like filler, about one token each.
func words(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString([]string{"cat", "sat", "on", "the", "mat", "and", "ate", "fish"}[i%8])
	}
	return b.String()
}
