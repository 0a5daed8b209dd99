package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/auth"
	"github.com/kvroute/kvroute/internal/fleet"
)

// get sends a GET to the proxy's path with an Authorization header (none if
// empty) and returns the response with its body read.
func get(t testing.TB, url, path, auth string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return res, string(data)
}

// testClock is a clock that moves only when told.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestRateLimits(t *testing.T) {
	be, _ := recordingBackend(t, 200, nil, "{}")
	clock := &testClock{t: time.Unix(1e9, 0)}
	p, px := newTestProxy(t, newFakeFleet(testBackend(t, 0, "b0", be.URL, "m")), newFirstPolicy(), func(c *Config) {
		c.Now = clock.Now
		c.Security.APIKeys = []auth.APIKey{{Key: "rpm", Name: "rpm", RPM: 2}, {Key: "tpm", Name: "tpm", TPM: 120}}
	})
	status := func(key, body string) (int, string, string) {
		path := "/v1/chat/completions"
		if !strings.Contains(body, "messages") {
			path = "/v1/completions"
		}
		res, data := post(t, px.URL, path, body, "Authorization", "Bearer "+key)
		_, typ, _ := func() (string, string, string) {
			if res.StatusCode == 200 {
				return "", "", ""
			}
			return openAIError(t, data)
		}()
		return res.StatusCode, res.Header.Get("Retry-After"), typ
	}
	// Two requests a minute: one comes back every 30 s.
	for i, want := range []int{200, 200, 429} {
		if got, _, _ := status("rpm", chatBody); got != want {
			t.Errorf("rpm request %d: %d, want %d", i, got, want)
		}
	}
	if got, after, typ := status("rpm", chatBody); got != 429 || after != "30" || typ != typeRequests {
		t.Errorf("over rpm: %d Retry-After %q type %q, want 429 30 requests", got, after, typ)
	}
	clock.Advance(30 * time.Second)
	if got, _, _ := status("rpm", chatBody); got != 200 {
		t.Errorf("after 30 s: %d, want 200", got)
	}

	// 120 tokens a minute, 2 a second; each request costs about 60.
	body := `{"model":"m","prompt":"` + strings.Repeat("x", 40) + `","max_tokens":50}` // 10 + 50 tokens
	for i, want := range []int{200, 200, 429} {
		if got, _, _ := status("tpm", body); got != want {
			t.Errorf("tpm request %d: %d, want %d", i, got, want)
		}
	}
	if got, after, typ := status("tpm", body); got != 429 || after != "30" || typ != typeTokens {
		t.Errorf("over tpm: %d Retry-After %q type %q, want 429 30 tokens", got, after, typ)
	}
	clock.Advance(30 * time.Second)
	if got, _, _ := status("tpm", body); got != 200 {
		t.Errorf("after 30 s: %d, want 200", got)
	}
	// The key's name, never the key, labels the metrics.
	page := metricsPage(t, p)
	if !strings.Contains(page, `kvroute_key_requests_total{key="tpm",outcome="rate_limited_tokens"} 2`) ||
		!strings.Contains(page, `kvroute_key_tokens_total{key="tpm"} 180`) {
		t.Errorf("metrics do not count the key's requests and tokens:\n%s", grepLines(page, "kvroute_key"))
	}
}

// metricsPage is the text of the proxy's MetricsHandler at /metrics.
func metricsPage(t *testing.T, p *Proxy) string {
	t.Helper()
	rec := httptest.NewRecorder()
	p.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("MetricsHandler /metrics: %d", rec.Code)
	}
	return rec.Body.String()
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestProbesNeedNoKey(t *testing.T) {
	_, px := newTestProxy(t, newFakeFleet(testBackend(t, 0, "b0", "http://b0", "m")), newFirstPolicy(), func(c *Config) {
		c.Security.APIKeys = []auth.APIKey{{Key: "k", Name: "n"}}
	})
	for _, tt := range []struct {
		path, auth string
		want       int
	}{
		{"/healthz", "", 200},
		{"/readyz", "", 200},
		{"/v1/models", "", 401},
		{"/v1/models", "Bearer k", 200},
		{"/v1/models", "bearer  k ", 200},
		{"/metrics", "", 401},
		{"/metrics", "Bearer k", 200}, // no metrics listener: the API serves them, to key holders
	} {
		if res, body := get(t, px.URL, tt.path, tt.auth); res.StatusCode != tt.want {
			t.Errorf("GET %s with %q: %d %s, want %d", tt.path, tt.auth, res.StatusCode, body, tt.want)
		}
	}
}

func TestCredentials(t *testing.T) {
	tests := []struct {
		name       string
		forward    bool
		backendKey fleet.Secret
		wantAuth   string
		wantCookie string
	}{
		{"stripped", false, "", "", ""},
		{"backend key replaces the client's", false, "backend-secret", "Bearer backend-secret", ""},
		{"forwarded", true, "", "Bearer client", "c=1"},
		{"forwarded, backend key wins", true, "backend-secret", "Bearer backend-secret", "c=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			be, got := recordingBackend(t, 200, nil, "{}")
			b := testBackend(t, 0, "b0", be.URL, "m")
			b.APIKey = tt.backendKey
			_, px := newTestProxy(t, newFakeFleet(b), newFirstPolicy(), func(c *Config) {
				c.Security.ForwardClientAuth = tt.forward
			})
			res, body := post(t, px.URL, "/v1/chat/completions", chatBody,
				"Authorization", "Bearer client", "Cookie", "c=1", "Proxy-Authorization", "Basic eA==", "X-Session-ID", "s")
			if res.StatusCode != 200 {
				t.Fatalf("%d %s", res.StatusCode, body)
			}
			s := <-got
			if a, c := s.header.Get("Authorization"), s.header.Get("Cookie"); a != tt.wantAuth || c != tt.wantCookie {
				t.Errorf("backend got Authorization %q Cookie %q, want %q %q", a, c, tt.wantAuth, tt.wantCookie)
			}
			if s.header.Get("Proxy-Authorization") != "" || s.header.Get("X-Session-ID") != "s" {
				t.Errorf("backend got headers %v", s.header)
			}
		})
	}
}

func TestAllowPath(t *testing.T) {
	be, got := recordingBackend(t, 200, nil, "{}")
	_, px := newTestProxy(t, newFakeFleet(testBackend(t, 0, "b0", be.URL, "m")), newFirstPolicy(), func(c *Config) {
		c.Security.AllowPaths = []string{"/v1/load_lora_adapter", "/tokenize/"}
	})
	tests := []struct {
		path     string
		want     int
		wantPath string
	}{
		{"/v1/load_lora_adapter", 200, "/v1/load_lora_adapter"},
		{"/v1/load_lora_adapter/x", 200, "/v1/load_lora_adapter/x"},
		{"/v1/load_lora_adapterx", 404, ""},
		{"/tokenize", 200, "/tokenize"},
		{"/detokenize", 404, ""},
		{"/v1/unload_lora_adapter", 404, ""},
	}
	for _, tt := range tests {
		res, body := post(t, px.URL, tt.path, `{"model":"m"}`)
		if res.StatusCode != tt.want {
			t.Errorf("POST %s: %d %s, want %d", tt.path, res.StatusCode, body, tt.want)
			continue
		}
		if tt.want == 200 {
			if s := <-got; s.path != tt.wantPath {
				t.Errorf("POST %s reached the backend as %s", tt.path, s.path)
			}
		}
	}
	for _, bad := range []string{"v1/x", "/", "/v1/../x", "/v1/%2fx"} {
		if _, err := New(Config{Fleet: newFakeFleet(), Router: routerOf(newFirstPolicy()), Logger: discard,
			Security: Security{AllowPaths: []string{bad}}}); err == nil {
			t.Errorf("--allow-path %q accepted", bad)
		}
	}
}

func TestMetricsElsewhere(t *testing.T) {
	p, px := newTestProxy(t, newFakeFleet(testBackend(t, 0, "b0", "http://b0", "m")), newFirstPolicy(), func(c *Config) {
		c.Security.MetricsElsewhere = true
	})
	if res, _ := get(t, px.URL, "/metrics", ""); res.StatusCode != 404 {
		t.Errorf("API /metrics: %d, want 404 when metrics have their own listener", res.StatusCode)
	}
	if page := metricsPage(t, p); !strings.Contains(page, "kvroute_requests_total") {
		t.Errorf("MetricsHandler page lacks kvroute_requests_total")
	}
	ms := httptest.NewServer(p.MetricsHandler())
	t.Cleanup(ms.Close)
	for path, want := range map[string]int{"/healthz": 200, "/metrics": 200, "/v1/models": 404, "/": 404} {
		if res, _ := get(t, ms.URL, path, ""); res.StatusCode != want {
			t.Errorf("metrics listener %s: %d, want %d", path, res.StatusCode, want)
		}
	}
}
