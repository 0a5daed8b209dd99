package proxy

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// syncBuffer is a bytes.Buffer safe for the proxy's concurrent log writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// records returns the JSON log lines written so far.
func (s *syncBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for line := range strings.Lines(s.b.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

var generatedID = regexp.MustCompile(`^[0-9a-f]{32}$`)

func TestRequestIDRoundTrip(t *testing.T) {
	const reply = `{"id":"chatcmpl-1","object":"chat.completion","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`
	tests := []struct {
		name string
		sent string // the client's X-Request-Id; "" sends none
		// want is the ID expected everywhere; "" means a generated one.
		want string
	}{
		{name: "client's kept", sent: "req-7f3a_2024.11/ABC", want: "req-7f3a_2024.11/ABC"},
		{name: "made when absent"},
		{name: "too long replaced", sent: strings.Repeat("x", maxRequestIDLen+1)},
		{name: "with a space replaced", sent: "a b"},
		{name: "not ASCII replaced", sent: "ïd"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			be, got := recordingBackend(t, http.StatusOK, http.Header{"Content-Type": {"application/json"}}, reply)
			b0 := testBackend(t, 0, "b0", be.URL, "m")
			var logs syncBuffer
			_, px := newTestProxy(t, newFakeFleet(b0), newFirstPolicy(), func(c *Config) {
				c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			})
			var header []string
			if tt.sent != "" {
				header = []string{HeaderRequestID, tt.sent}
			}
			res, _ := post(t, px.URL, "/v1/chat/completions", chatBody, header...)
			if res.StatusCode != http.StatusOK {
				t.Fatalf("status %d", res.StatusCode)
			}
			id := res.Header.Get(HeaderRequestID)
			switch {
			case tt.want != "" && id != tt.want:
				t.Errorf("response %s = %q, want the client's %q", HeaderRequestID, id, tt.want)
			case tt.want == "" && !generatedID.MatchString(id):
				t.Errorf("response %s = %q, want 32 hex digits", HeaderRequestID, id)
			}
			if up := (<-got).header.Values(HeaderRequestID); len(up) != 1 || up[0] != id {
				t.Errorf("backend got %s %q, want exactly %q", HeaderRequestID, up, id)
			}
			be.await(t)
			px.await(t)
			var found bool
			for _, rec := range logs.records(t) {
				if rec["msg"] == "request" {
					found = true
					if rec["request_id"] != id {
						t.Errorf("request log line has request_id %v, want %q", rec["request_id"], id)
					}
				}
			}
			if !found {
				t.Error("no debug line about the request")
			}
		})
	}
}

func TestRequestIDOnRetriesAndRejections(t *testing.T) {
	bad, _ := recordingBackend(t, http.StatusServiceUnavailable, nil, "busy")
	good, got := recordingBackend(t, http.StatusOK, http.Header{"Content-Type": {"application/json"}}, `{"choices":[]}`)
	b0 := testBackend(t, 0, "b0", bad.URL, "m")
	b1 := testBackend(t, 1, "b1", good.URL, "m")
	var logs syncBuffer
	_, px := newTestProxy(t, newFakeFleet(b0, b1), newFirstPolicy(), func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	res, _ := post(t, px.URL, "/v1/chat/completions", chatBody, HeaderRequestID, "retry-me")
	if res.StatusCode != http.StatusOK || res.Header.Get(HeaderRequestID) != "retry-me" {
		t.Fatalf("status %d, %s %q", res.StatusCode, HeaderRequestID, res.Header.Get(HeaderRequestID))
	}
	if up := (<-got).header.Get(HeaderRequestID); up != "retry-me" {
		t.Errorf("the retried attempt went upstream with %s %q", HeaderRequestID, up)
	}
	bad.await(t)
	good.await(t)
	px.await(t)
	var warned bool
	for _, rec := range logs.records(t) {
		if rec["level"] == "WARN" && rec["backend"] != nil { // a line about a request, not the start's

			warned = true
			if rec["request_id"] != "retry-me" {
				t.Errorf("warning %q has request_id %v", rec["msg"], rec["request_id"])
			}
		}
	}
	if !warned {
		t.Error("no warning about the failed attempt")
	}

	// A request refused before any backend still gets its ID back.
	res, _ = post(t, px.URL, "/v1/nowhere/../x", "{}")
	if !generatedID.MatchString(res.Header.Get(HeaderRequestID)) {
		t.Errorf("refused request (%d) has %s %q", res.StatusCode, HeaderRequestID, res.Header.Get(HeaderRequestID))
	}
}

func BenchmarkNewRequestID(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		sinkID = newRequestID()
	}
}

var sinkID string

// The debug line of a request lists every candidate's cost term by term,
// as the policy named them.
func TestDebugLogListsCostTerms(t *testing.T) {
	be, _ := recordingBackend(t, http.StatusOK, http.Header{"Content-Type": {"application/json"}}, `{"choices":[]}`)
	var logs syncBuffer
	_, px := newTestProxy(t, newFakeFleet(testBackend(t, 0, "b0", be.URL, "m")), newFirstPolicy(), func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	if res, body := post(t, px.URL, "/v1/chat/completions", chatBody); res.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	be.await(t)
	px.await(t)
	for _, rec := range logs.records(t) {
		if rec["msg"] != "request" {
			continue
		}
		scores, _ := rec["scores"].([]any)
		if len(scores) != 1 {
			t.Fatalf("scores = %v, want one", rec["scores"])
		}
		terms, _ := scores[0].(map[string]any)["Terms"].(map[string]any)
		if terms["queued"] != 0.25 || terms["miss"] != 0.75 || len(terms) != 2 {
			t.Errorf("terms = %v, want queued 0.25 and miss 0.75", scores[0])
		}
		return
	}
	t.Error("no debug line about the request")
}
