package main

import (
	"context"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP trace collector in this process: it keeps
// the spans it is sent, and the resources' service names.
type otlpReceiver struct {
	*httptest.Server
	mu       sync.Mutex
	spans    []*tracepb.Span
	services []string
	paths    []string
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		var msg coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &msg)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.paths = append(r.paths, req.URL.Path)
		for _, rs := range msg.ResourceSpans {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					r.services = append(r.services, kv.GetValue().GetStringValue())
				}
			}
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.Close)
	return r
}

// `kvroute serve --otlp-endpoint` sends a request's spans to the collector
// (flushed when serve stops), and the backend gets a traceparent in the
// same trace, naming the attempt's span.
func TestServeExportsTraces(t *testing.T) {
	col := newOTLPReceiver(t)
	emu, err := url.Parse(startEmulators(t, 1)[0])
	if err != nil {
		t.Fatal(err)
	}
	traceparents := make(chan string, 10)
	rp := httputil.NewSingleHostReverseProxy(emu)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			traceparents <- r.Header.Get("Traceparent")
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(backend.Close)

	cfg, err := parseServeFlags([]string{"--listen", "127.0.0.1:0", "--metrics-listen", "", "--drain-delay", "0",
		"--backend", "a=" + backend.URL, "--otlp-endpoint", col.URL, "--trace-sample", "1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(slog.DiscardHandler), ready) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	if r := chat(t, "http://"+addr, `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`); r.status != 200 {
		t.Fatalf("chat: %+v", r)
	}
	tp := <-traceparents
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	col.mu.Lock()
	defer col.mu.Unlock()
	byName := map[string]*tracepb.Span{}
	for _, s := range col.spans {
		byName[s.Name] = s
	}
	req, pick, att := byName["kvroute.request"], byName["kvroute.pick"], byName["kvroute.attempt"]
	if req == nil || pick == nil || att == nil {
		t.Fatalf("collector got spans %v, want kvroute.request, kvroute.pick and kvroute.attempt", names(col.spans))
	}
	if len(col.paths) == 0 || col.paths[0] != "/v1/traces" {
		t.Errorf("exported to %v, want /v1/traces", col.paths)
	}
	if len(col.services) == 0 || col.services[0] != "kvroute" {
		t.Errorf("service names %v, want kvroute", col.services)
	}
	tid := hex.EncodeToString(req.TraceId)
	for _, s := range []*tracepb.Span{pick, att} {
		if hex.EncodeToString(s.TraceId) != tid || string(s.ParentSpanId) != string(req.SpanId) {
			t.Errorf("%s is not the request span's child", s.Name)
		}
	}
	want := "00-" + tid + "-" + hex.EncodeToString(att.SpanId) + "-01"
	if tp != want {
		t.Errorf("backend got traceparent %q, want %q", tp, want)
	}
	for _, kv := range pick.Attributes {
		if kv.Key == "kvroute.backend" && kv.GetValue().GetStringValue() != "a" {
			t.Errorf("pick span's backend %v", kv.GetValue())
		}
	}
}

func names(spans []*tracepb.Span) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

func TestTracingFlags(t *testing.T) {
	for _, tt := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--otlp-endpoint", "collector:4318", "--otlp-insecure"}, ""},
		{[]string{"--otlp-endpoint", "https://collector:4318/otlp/v1/traces"}, ""},
		{[]string{"--trace-sample", "1.5"}, "--trace-sample"},
		{[]string{"--otlp-endpoint", "ftp://collector"}, "--otlp-endpoint"},
		{[]string{"--otlp-endpoint", "collector:4318/v1/traces"}, "--otlp-endpoint"},
	} {
		_, err := parseServeFlags(append([]string{"--backend", "http://127.0.0.1:9001"}, tt.args...), io.Discard)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%v: err = %v, want %q", tt.args, err, tt.wantErr)
		}
	}
}
