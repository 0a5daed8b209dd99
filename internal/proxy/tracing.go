package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/router"
)

// Tracing: with Config.TracerProvider set, every proxied request (a /v1/
// path) gets a server span "kvroute.request", continuing the client's W3C
// traceparent when it sent one; each routing decision a child span
// "kvroute.pick" with the policy's explanation; each try at a backend a
// child span "kvroute.attempt", whose context goes upstream as traceparent
// (and tracestate), so that the backend's own spans hang below it. Without
// a TracerProvider p.tracer is nil and every hook below returns at once.

// tracerName is the instrumentation scope of kvroute's spans.
const tracerName = "github.com/kvroute/kvroute/internal/proxy"

// Span names.
const (
	spanRequest = "kvroute.request"
	spanPick    = "kvroute.pick"
	spanAttempt = "kvroute.attempt"
)

// maxTracedCandidates bounds the candidates whose scores a pick span
// carries: the chosen one and the cheapest others, as Decision.Scores
// orders them for kvroute.
const maxTracedCandidates = 16

// traceContext is the propagator of traces in and out: W3C TraceContext.
var traceContext = propagation.TraceContext{}

// newTracer returns the proxy's tracer from tp; nil (tracing off) for a nil
// tp.
func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(tracerName)
}

// traced reports whether path's requests get a span: the API, not the
// probes and the metrics.
func traced(path string) bool { return strings.HasPrefix(path, "/v1/") }

// traceRequest starts r's request span when tracing is on and r is proxied:
// *r gets the span's context, *w a writer that notes the status. The
// returned function ends the span; defer it at once:
//
//	defer p.traceRequest(&w, &r)()
func (p *Proxy) traceRequest(w *http.ResponseWriter, r **http.Request) func() {
	if p.tracer == nil || !traced((*r).URL.Path) {
		return func() {}
	}
	in := *r
	ctx := traceContext.Extract(in.Context(), propagation.HeaderCarrier(in.Header))
	ctx, span := p.tracer.Start(ctx, spanRequest, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			attribute.String("http.request.method", in.Method),
			attribute.String("url.path", in.URL.Path),
			attribute.String("kvroute.request_id", requestID(in)),
		))
	sw := &statusWriter{ResponseWriter: *w}
	*w, *r = sw, in.WithContext(ctx)
	return func() {
		if v := recover(); v != nil {
			// A response cut after its headers (http.ErrAbortHandler), or
			// a bug: either way the client did not get it whole.
			span.SetStatus(codes.Error, "response aborted")
			span.SetAttributes(attribute.Int("http.response.status_code", sw.code()))
			span.End()
			panic(v)
		}
		code := sw.code()
		span.SetAttributes(attribute.Int("http.response.status_code", code))
		if code >= 500 {
			span.SetStatus(codes.Error, http.StatusText(code))
		}
		span.End()
	}
}

// traceCall puts what the proxy read of c's body on the request span: the
// model and the session key, hashed (a session key may name a user).
func (p *Proxy) traceCall(r *http.Request, c *call) {
	if p.tracer == nil {
		return
	}
	span := trace.SpanFromContext(r.Context())
	if !span.IsRecording() {
		return
	}
	if c.req == nil {
		if m := request.Model(c.body); m != "" {
			span.SetAttributes(attribute.String("gen_ai.request.model", m))
		}
		return
	}
	span.SetAttributes(attribute.String("gen_ai.request.model", c.req.Model))
	if c.req.SessionKey != "" {
		span.SetAttributes(attribute.String("kvroute.session_hash", hashSession(c.req.SessionKey)))
	}
}

// hashSession is a session key as traces show it: the first 8 bytes of its
// SHA-256, in hex. Equal keys give equal hashes, so a conversation's turns
// can be found together, and the key itself is not exported.
func hashSession(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

// tracedRoute is route (forward.go) inside a "kvroute.pick" span that
// carries the decision: policy, backend, reason, the predicted TTFT and
// cached tokens, and the candidates' scores (at most maxTracedCandidates).
func (p *Proxy) tracedRoute(ctx context.Context, c *call, cands []*fleet.Backend) (*router.Ticket, *apiError) {
	if p.tracer == nil {
		return p.route(c, cands)
	}
	policy := p.byLoad.Name()
	if c.req != nil {
		policy = p.router.Name()
	}
	_, span := p.tracer.Start(ctx, spanPick, trace.WithAttributes(
		attribute.String("kvroute.policy", policy),
		attribute.Int("kvroute.candidates", len(cands))))
	defer span.End()
	t, e := p.route(c, cands)
	if e != nil {
		span.SetStatus(codes.Error, e.Message)
		return t, e
	}
	if !span.IsRecording() {
		return t, e
	}
	d := &t.Decision
	span.SetAttributes(
		attribute.String("kvroute.backend", d.Backend.Name),
		attribute.String("kvroute.reason", d.Reason),
		attribute.Float64("kvroute.predicted_ttft_ms", ms(d.PredictedTTFT)),
		attribute.Int("kvroute.predicted_cached_tokens", d.Cached))
	if n := min(len(d.Scores), maxTracedCandidates); n > 0 {
		names, ttfts, cached, costs := make([]string, n), make([]float64, n), make([]int64, n), make([]float64, n)
		for i, s := range d.Scores[:n] {
			names[i], ttfts[i], cached[i], costs[i] = s.Backend, ms(s.TTFT), int64(s.Cached), s.Cost
		}
		span.SetAttributes(
			attribute.StringSlice("kvroute.candidate.backends", names),
			attribute.Float64Slice("kvroute.candidate.predicted_ttft_ms", ttfts),
			attribute.Int64Slice("kvroute.candidate.predicted_cached_tokens", cached),
			attribute.Float64Slice("kvroute.candidate.costs", costs))
	}
	return t, e
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// traceAttempt starts a's span below ctx's and returns its context; ctx
// as it is when tracing is off.
func (p *Proxy) traceAttempt(ctx context.Context, a *attempt) context.Context {
	if p.tracer == nil {
		return ctx
	}
	ctx, a.span = p.tracer.Start(ctx, spanAttempt, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("kvroute.backend", a.t.Backend.Name)))
	return ctx
}

// traceUpstream puts the context of a's span on the upstream request as
// traceparent and tracestate, in place of the client's.
func traceUpstream(a *attempt, out *http.Request) *http.Request {
	if a.span == nil {
		return out
	}
	out.Header.Del("Traceparent")
	out.Header.Del("Tracestate")
	traceContext.Inject(out.Context(), propagation.HeaderCarrier(out.Header))
	return out
}

// traceAttemptEnd ends a's span with its outcome: the backend's status,
// and why it failed when the request went on to another backend (or was
// answered by giveUp).
func traceAttemptEnd(a *attempt) {
	span := a.span
	if span == nil {
		return
	}
	defer span.End()
	if !span.IsRecording() {
		return
	}
	o := &a.out
	if o.Status > 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", o.Status))
	}
	if a.first {
		span.SetAttributes(attribute.Float64("kvroute.ttft_ms", ms(o.TTFT)))
	}
	if o.PromptTokens >= 0 {
		span.SetAttributes(attribute.Int("gen_ai.usage.input_tokens", o.PromptTokens))
	}
	if o.CachedTokens >= 0 {
		span.SetAttributes(attribute.Int("kvroute.cached_tokens", o.CachedTokens))
	}
	if o.CompletionTokens >= 0 {
		span.SetAttributes(attribute.Int("gen_ai.usage.output_tokens", o.CompletionTokens))
	}
	switch {
	case a.status == "":
		// Not counted: the attempt failed before answering.
		reason := a.fail
		if reason == "" {
			reason = "status"
		}
		span.SetAttributes(attribute.String("kvroute.retry_reason", reason))
		span.SetStatus(codes.Error, "backend failed before answering: "+reason)
	case a.status == statusClientClosed:
		span.SetAttributes(attribute.String("kvroute.failure", "client_closed"))
	case a.fail != "":
		span.SetAttributes(attribute.String("kvroute.failure", a.fail))
		span.SetStatus(codes.Error, "backend failed: "+a.fail)
	case o.Status >= 500:
		span.SetStatus(codes.Error, http.StatusText(o.Status))
	}
}

// statusWriter notes the status of a traced request's response.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// code is the response's status; 200 if nothing was written (net/http
// sends that).
func (s *statusWriter) code() int {
	if s.status == 0 {
		return http.StatusOK
	}
	return s.status
}

// Unwrap lets http.ResponseController reach the connection.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
