package proxy

import (
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// scoredPolicy picks the first candidate and explains it with more scores
// than a span keeps.
type scoredPolicy struct{}

func (scoredPolicy) Name() string { return "scored" }

func (scoredPolicy) Pick(_ *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	scores := make([]router.Score, 20)
	for i := range scores {
		scores[i] = router.Score{Backend: "c" + string(rune('a'+i)), Cost: float64(i), TTFT: 1500 * time.Millisecond, Cached: i}
	}
	scores[0].Backend = cands[0].Name
	return router.Decision{Backend: cands[0], Reason: "prefix", Cached: 12, PredictedTTFT: 250 * time.Millisecond, Scores: scores}, nil
}

// The client's traceparent is continued: a request span, below it a pick
// and an attempt per backend tried, and the backend that answered gets a
// traceparent naming its attempt's span.
func TestTracingSpanTree(t *testing.T) {
	failing, _ := recordingBackend(t, http.StatusServiceUnavailable, nil, `{"error":"busy"}`)
	ok, got := recordingBackend(t, http.StatusOK, http.Header{"Content-Type": {"application/json"}},
		`{"choices":[],"usage":{"prompt_tokens":21,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":16}}}`)
	b0 := testBackend(t, 0, "b0", failing.URL, "m")
	b1 := testBackend(t, 1, "b1", ok.URL, "m")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	_, px := newTestProxy(t, newFakeFleet(b0, b1), scoredPolicy{}, func(c *Config) { c.TracerProvider = tp })

	const (
		clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
		clientSpan  = "00f067aa0ba902b7"
	)
	res, _ := post(t, px.URL, "/v1/chat/completions", chatBody,
		"Traceparent", "00-"+clientTrace+"-"+clientSpan+"-01", "Tracestate", "vendor=x",
		"X-Session-ID", "alice", HeaderRequestID, "req-1")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	px.await(t)

	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	if len(byName[spanRequest]) != 1 || len(byName[spanPick]) != 2 || len(byName[spanAttempt]) != 2 {
		t.Fatalf("spans %v, want one request, two picks, two attempts", byName)
	}
	req := byName[spanRequest][0]
	if tid := req.SpanContext().TraceID().String(); tid != clientTrace {
		t.Errorf("request span's trace %s, want the client's %s", tid, clientTrace)
	}
	if p := req.Parent(); !p.IsRemote() || p.SpanID().String() != clientSpan {
		t.Errorf("request span's parent %v, want the client's span", p)
	}
	if req.SpanKind() != trace.SpanKindServer {
		t.Errorf("request span kind %v", req.SpanKind())
	}
	wantAttrs(t, req, map[string]any{
		"http.request.method": "POST", "url.path": "/v1/chat/completions", "gen_ai.request.model": "m",
		"http.response.status_code": int64(200), "kvroute.request_id": "req-1",
		"kvroute.session_hash": hashSession("alice"),
	})
	for _, s := range append(byName[spanPick], byName[spanAttempt]...) {
		if s.Parent().SpanID() != req.SpanContext().SpanID() {
			t.Errorf("%s's parent %v, want the request span", s.Name(), s.Parent().SpanID())
		}
	}
	pick := byName[spanPick][0]
	wantAttrs(t, pick, map[string]any{
		"kvroute.policy": "scored", "kvroute.backend": "b0", "kvroute.reason": "prefix",
		"kvroute.predicted_ttft_ms": 250.0, "kvroute.predicted_cached_tokens": int64(12), "kvroute.candidates": int64(2),
	})
	if n := sliceLen(pick, "kvroute.candidate.predicted_ttft_ms"); n != maxTracedCandidates {
		t.Errorf("pick span carries %d candidates' TTFTs, want %d", n, maxTracedCandidates)
	}
	if n := sliceLen(pick, "kvroute.candidate.backends"); n != maxTracedCandidates {
		t.Errorf("pick span carries %d candidates, want %d", n, maxTracedCandidates)
	}
	first, second := byName[spanAttempt][0], byName[spanAttempt][1]
	if first.StartTime().After(second.StartTime()) {
		first, second = second, first
	}
	wantAttrs(t, first, map[string]any{"kvroute.backend": "b0", "http.response.status_code": int64(503), "kvroute.retry_reason": "status"})
	wantAttrs(t, second, map[string]any{"kvroute.backend": "b1", "http.response.status_code": int64(200),
		"kvroute.cached_tokens": int64(16), "gen_ai.usage.input_tokens": int64(21)})
	if second.SpanKind() != trace.SpanKindClient {
		t.Errorf("attempt span kind %v", second.SpanKind())
	}
	if _, ok := attr(second, "kvroute.retry_reason"); ok {
		t.Error("the successful attempt has a retry reason")
	}

	s := <-got
	tp0 := s.header.Get("Traceparent")
	want := "00-" + clientTrace + "-" + second.SpanContext().SpanID().String() + "-01"
	if tp0 != want {
		t.Errorf("backend got traceparent %q, want %q (the trace, below the attempt's span)", tp0, want)
	}
	if ts := s.header.Get("Tracestate"); ts != "vendor=x" {
		t.Errorf("backend got tracestate %q, want the client's", ts)
	}
}

// Without a TracerProvider the proxy neither records nor rewrites a trace:
// the client's traceparent goes upstream as it came.
func TestTracingOff(t *testing.T) {
	be, got := recordingBackend(t, http.StatusOK, nil, `{}`)
	b0 := testBackend(t, 0, "b0", be.URL, "m")
	_, px := newTestProxy(t, newFakeFleet(b0), newFirstPolicy(), nil)
	const in = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	post(t, px.URL, "/v1/chat/completions", chatBody, "Traceparent", in)
	if s := <-got; s.header.Get("Traceparent") != in {
		t.Errorf("backend got traceparent %q, want the client's %q", s.header.Get("Traceparent"), in)
	}
}

func attr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func sliceLen(s sdktrace.ReadOnlySpan, key string) int {
	v, ok := attr(s, key)
	if !ok {
		return 0
	}
	switch v.Type() {
	case attribute.STRINGSLICE:
		return len(v.AsStringSlice())
	case attribute.FLOAT64SLICE:
		return len(v.AsFloat64Slice())
	case attribute.INT64SLICE:
		return len(v.AsInt64Slice())
	}
	return -1
}

func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]any) {
	t.Helper()
	for k, w := range want {
		v, ok := attr(s, k)
		if !ok {
			t.Errorf("%s: no attribute %s", s.Name(), k)
			continue
		}
		if g := v.AsInterface(); g != w {
			t.Errorf("%s: %s = %v (%T), want %v (%T)", s.Name(), k, g, g, w, w)
		}
	}
}
