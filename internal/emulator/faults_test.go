package emulator

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// noAnswer is how long a test waits to see that a hung server does not
// answer. It bounds the test's duration and asserts nothing about speed.
const noAnswer = 200 * time.Millisecond

// send posts body to url under ctx; it returns the response or the error.
func send(ctx context.Context, url, body string, header http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	return http.DefaultClient.Do(req)
}

const (
	completionBody = `{"prompt":"The quick brown fox","max_tokens":8}`
	streamBody     = `{"prompt":"The quick brown fox","max_tokens":8,"stream":true}`
	chatStreamBody = `{"messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true}`
)

// contentEvents reads a stream's data events until it ends or fails and
// returns the events carrying a token's text and the read error, if any.
func contentEvents(r io.Reader) (tokens []string, done bool, err error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var c responseJSON
		if json.Unmarshal([]byte(data), &c) == nil && len(c.Choices) == 1 && c.Choices[0].FinishReason == nil {
			if t := c.Choices[0].Text; t != nil {
				tokens = append(tokens, *t)
			} else if c.Choices[0].Delta != nil && c.Choices[0].Delta.Content != nil && *c.Choices[0].Delta.Content != "" {
				tokens = append(tokens, *c.Choices[0].Delta.Content)
			}
		}
	}
	return tokens, done, sc.Err()
}

func TestFaultsValidate(t *testing.T) {
	tests := []struct {
		name    string
		f       Faults
		wantErr bool
	}{
		{"zero", Faults{}, false},
		{"all", Faults{Hang: true, HangAfterFirst: true, Rate500: 0.5, Rate429: 0.5, RetryAfter: 3,
			DieAfterTokens: 2, Slow: 3, HealthFail: true}, false},
		{"rate above 1", Faults{Rate500: 1.5}, true},
		{"negative rate", Faults{Rate429: -0.1}, true},
		{"NaN rate", Faults{Rate500: math.NaN()}, true},
		{"rates sum above 1", Faults{Rate500: 0.6, Rate429: 0.6}, true},
		{"negative retry", Faults{RetryAfter: -1}, true},
		{"negative die", Faults{DieAfterTokens: -1}, true},
		{"negative slow", Faults{Slow: -2}, true},
		{"infinite slow", Faults{Slow: math.Inf(1)}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.f.Validate(); (err != nil) != tt.wantErr {
				t.Errorf("Validate() = %v, wantErr %v", err, tt.wantErr)
			}
		})
	}
	if _, err := New(Config{Faults: Faults{Rate500: 2}}); err == nil {
		t.Error("New accepted an invalid fault")
	}
}

func TestFaultHang(t *testing.T) {
	_, url := startServer(t, Config{Faults: Faults{Hang: true}}, nil)
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		ctx, cancel := context.WithTimeout(context.Background(), noAnswer)
		resp, err := send(ctx, url+path, streamBody, nil)
		cancel()
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s: answered %d despite the hang fault", path, resp.StatusCode)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: %v, want a deadline", path, err)
		}
	}
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/health %d while hanging, want 200", resp.StatusCode)
	}
}

func TestFaultHangAfterFirst(t *testing.T) {
	_, url := startServer(t, Config{Faults: Faults{HangAfterFirst: true}}, nil)
	for _, tc := range []struct{ path, body string }{
		{"/v1/completions", streamBody},
		{"/v1/chat/completions", chatStreamBody},
	} {
		t.Run(tc.path, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), noAnswer)
			defer cancel()
			resp, err := send(ctx, url+tc.path, tc.body, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			tokens, done, err := contentEvents(resp.Body)
			if len(tokens) != 1 || done || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("got %d tokens, [DONE] %v, error %v; want 1 token then a stall", len(tokens), done, err)
			}
		})
	}
	t.Run("not streaming", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), noAnswer)
		defer cancel()
		resp, err := send(ctx, url+"/v1/completions", completionBody, nil)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("answered %d despite the hang fault", resp.StatusCode)
		}
	})
}

func TestFaultDieAfterTokens(t *testing.T) {
	s, url := startServer(t, Config{Faults: Faults{DieAfterTokens: 3}}, nil)
	for _, tc := range []struct{ path, body string }{
		{"/v1/completions", streamBody},
		{"/v1/chat/completions", chatStreamBody},
	} {
		t.Run(tc.path, func(t *testing.T) {
			resp, err := send(context.Background(), url+tc.path, tc.body, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			tokens, done, err := contentEvents(resp.Body)
			if len(tokens) != 3 || done || !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("got %d tokens, [DONE] %v, error %v; want 3 tokens and a cut connection", len(tokens), done, err)
			}
		})
	}
	t.Run("not streaming", func(t *testing.T) {
		resp, err := send(context.Background(), url+"/v1/completions", completionBody, nil)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("answered %d, want a closed connection", resp.StatusCode)
		}
	})
	t.Run("shorter reply completes", func(t *testing.T) {
		if err := s.SetFaults(Faults{DieAfterTokens: 9}); err != nil {
			t.Fatal(err)
		}
		events, _ := stream(t, url+"/v1/completions", map[string]any{"prompt": "x", "max_tokens": 8, "stream": true})
		if events[len(events)-1] != "[DONE]" {
			t.Errorf("an 8-token reply with die_after_tokens 9 did not finish: %q", events)
		}
	})
	if got := metricValueLabel(t, scrape(t, url), "kvroute_emulator_faults_total", "fault", faultDie); got != 3 {
		t.Errorf("faults_total{fault=die} = %v, want 3", got)
	}
}

// metricValueLabel returns the counter value of the sample of name whose
// label has value.
func metricValueLabel(t *testing.T, fams map[string]*dto.MetricFamily, name, label, value string) float64 {
	t.Helper()
	for _, m := range fams[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == value {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no sample %s{%s=%q}", name, label, value)
	return 0
}

func TestFaultErrorRates(t *testing.T) {
	t.Run("500", func(t *testing.T) {
		_, url := startServer(t, Config{Faults: Faults{Rate500: 1}}, nil)
		resp, body := post(t, url+"/v1/chat/completions", chatStreamBody)
		var e errorJSON
		if resp.StatusCode != http.StatusInternalServerError || json.Unmarshal(body, &e) != nil || e.Error == nil || e.Error.Type != "server_error" {
			t.Errorf("status %d body %s; want a 500 server_error", resp.StatusCode, body)
		}
	})
	t.Run("429", func(t *testing.T) {
		_, url := startServer(t, Config{Faults: Faults{Rate429: 1, RetryAfter: 7}}, nil)
		resp, body := post(t, url+"/v1/completions", completionBody)
		var e errorJSON
		if resp.StatusCode != http.StatusTooManyRequests || json.Unmarshal(body, &e) != nil || e.Error == nil ||
			e.Error.Code == nil || *e.Error.Code != "rate_limit_exceeded" {
			t.Errorf("status %d body %s; want a 429 rate_limit_exceeded", resp.StatusCode, body)
		}
		if got := resp.Header.Get("Retry-After"); got != "7" {
			t.Errorf("Retry-After %q, want 7", got)
		}
	})
	// Equal seeds give equal sequences of outcomes; the rates show in them.
	statuses := func(seed uint64) []int {
		_, url := startServer(t, Config{Seed: seed, Faults: Faults{Rate500: 0.25, Rate429: 0.25}}, nil)
		var got []int
		for range 40 {
			resp, _ := post(t, url+"/v1/completions", `{"prompt":"x","max_tokens":1}`)
			got = append(got, resp.StatusCode)
		}
		return got
	}
	a, b := statuses(7), statuses(7)
	count := map[int]int{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("request %d: status %d then %d with the same seed", i, a[i], b[i])
		}
		count[a[i]]++
	}
	if count[200] == 0 || count[500] == 0 || count[429] == 0 || count[200]+count[500]+count[429] != len(a) {
		t.Errorf("statuses %v: want a mix of 200, 500 and 429", count)
	}
}

func TestFaultSlow(t *testing.T) {
	latency := func(slow float64) float64 {
		_, url := startServer(t, Config{Faults: Faults{Slow: slow}}, nil)
		_, h := complete(t, url+"/v1/completions", map[string]any{"prompt": words(200), "max_tokens": 20})
		return headerSeconds(t, h, HeaderModelLatency)
	}
	base, slow := latency(1), latency(4)
	if ratio := slow / base; math.Abs(ratio-4) > 0.01 {
		t.Errorf("model latency %v s with slow_factor 4, %v s without: ratio %v, want 4", slow, base, ratio)
	}
}

func TestFaultHealthFail(t *testing.T) {
	s, url := startServer(t, Config{Faults: Faults{HealthFail: true}}, nil)
	status := func() int {
		resp, err := http.Get(url + "/health")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status(); got != http.StatusServiceUnavailable {
		t.Errorf("/health %d, want 503", got)
	}
	if err := s.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	if got := status(); got != http.StatusOK {
		t.Errorf("/health %d after clearing the fault, want 200", got)
	}
}

func TestAPIKey(t *testing.T) {
	_, url := startServer(t, Config{APIKey: "sekrit"}, nil)
	tests := []struct {
		name, method, path, auth string
		want                     int
	}{
		{"no key", "POST", "/v1/completions", "", http.StatusUnauthorized},
		{"wrong key", "POST", "/v1/completions", "Bearer nope", http.StatusUnauthorized},
		{"not bearer", "POST", "/v1/completions", "Basic sekrit", http.StatusUnauthorized},
		{"key", "POST", "/v1/completions", "Bearer sekrit", http.StatusOK},
		{"scheme case", "POST", "/v1/chat/completions", "bearer sekrit", http.StatusOK},
		{"models guarded", "GET", "/v1/models", "", http.StatusUnauthorized},
		{"unknown /v1 path guarded", "GET", "/v1/nothing", "", http.StatusUnauthorized},
		{"health open", "GET", "/health", "", http.StatusOK},
		{"metrics open", "GET", "/metrics", "", http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := completionBody
			if strings.Contains(tt.path, "chat") {
				body = `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
			}
			req, err := http.NewRequest(tt.method, url+tt.path, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.want, data)
			}
			var e errorJSON
			if tt.want == http.StatusUnauthorized && (json.Unmarshal(data, &e) != nil || e.Error == nil || e.Error.Code == nil || *e.Error.Code != "invalid_api_key") {
				t.Errorf("401 body %s, want an OpenAI error with code invalid_api_key", data)
			}
		})
	}
}

func TestAdminFaults(t *testing.T) {
	s, url := startServer(t, Config{Admin: true, Faults: Faults{RetryAfter: 1}}, nil)
	do := func(method, body string) (int, string) {
		req, err := http.NewRequest(method, url+"/admin/faults", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	if code, body := do("GET", ""); code != 200 || !strings.Contains(body, `"retry_after_seconds":1`) {
		t.Errorf("GET: %d %s", code, body)
	}
	want := Faults{Rate500: 0.5, RetryAfter: 3, DieAfterTokens: 4, Slow: 2, HealthFail: true}
	data, _ := json.Marshal(want)
	if code, body := do("PUT", string(data)); code != 200 || strings.TrimSpace(body) != string(data) {
		t.Errorf("PUT: %d %s, want 200 %s", code, body, data)
	}
	if got := s.Faults(); got != want {
		t.Errorf("after PUT, Faults() = %+v, want %+v", got, want)
	}
	for _, tc := range []struct{ name, method, body string }{
		{"out of range", "PUT", `{"rate_500":2}`},
		{"unknown field", "PUT", `{"hang":true,"bogus":1}`},
		{"not JSON", "PUT", `hang`},
	} {
		if code, body := do(tc.method, tc.body); code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", tc.name, code, body)
		}
	}
	if code, _ := do("POST", "{}"); code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", code)
	}
	if got := s.Faults(); got != want {
		t.Errorf("rejected PUTs changed the faults to %+v", got)
	}

	// A remote client is refused even with admin on.
	w := httptest.NewRecorder()
	r := httptest.NewRequest("PUT", "/admin/faults", strings.NewReader(`{}`))
	r.RemoteAddr = "192.0.2.1:1234"
	s.ServeHTTP(w, r)
	if w.Code != http.StatusForbidden || s.Faults() != want {
		t.Errorf("remote PUT: %d, faults %+v; want 403 and no change", w.Code, s.Faults())
	}
	for _, addr := range []string{"127.0.0.1:9", "[::1]:9", "[::ffff:127.0.0.1]:9"} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/admin/faults", nil)
		r.RemoteAddr = addr
		s.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Errorf("GET from %s: %d, want 200", addr, w.Code)
		}
	}

	// Without Admin the endpoint does not exist.
	_, off := startServer(t, Config{}, nil)
	resp, err := http.Get(off + "/admin/faults")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("admin off: %d, want 404", resp.StatusCode)
	}
}
