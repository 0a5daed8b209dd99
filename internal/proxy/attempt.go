package proxy

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/jsonscan"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/sse"
	"github.com/kvroute/kvroute/internal/upstream"
)

// attempt is one try of a call at one backend: its ticket (its share of the
// backend's load, counted when it was routed), its timing and its outcome.
// finish records everything and finishes the ticket; the prefill part of
// the load is released at the first token.
type attempt struct {
	p  *Proxy
	c  *call
	t  *router.Ticket
	wd *watchdog // &dog
	// cancel ends the attempt's upstream request, with its cause.
	cancel context.CancelCauseFunc
	start  time.Time
	// The parts of the copy, allocated with the attempt rather than each
	// on its own.
	dog  watchdog
	hw   heldWriter
	sc   sse.Scanner
	ec   sse.Copier
	body idleReader
	sink idleSink
	// first is set at the first token; complete when the response was
	// copied to its end.
	first, complete bool
	// status is the requests_total status label; "" if the attempt is not
	// counted (it failed before answering and the request is retried or
	// answered by giveUp).
	status string
	// fail is why the backend gave no usable answer: "timeout", or "dial",
	// "reset" or "read" (a gateway error); "" if it answered.
	fail string
	out  router.Outcome
	span trace.Span // tracing.go; nil when tracing is off
}

// The causes that end an upstream request early.
var (
	errFirstTokenTimeout = errors.New("no first token before the deadline")
	errIdleTimeout       = errors.New("the stream was idle past the timeout")
	errShutdown          = errors.New("kvroute is shutting down")
	errIncomplete        = errors.New("the stream ended with no finish_reason and no [DONE]")
)

// attempt forwards c to t's backend and copies the response to w. It
// returns the failure when nothing reached the client and another backend
// may take the request (when canRetry, a 429/502/503/504 answer counts as
// one; otherwise it goes to the client as it is), and abort when a
// non-streamed response broke off after its headers were sent. A stream
// that breaks off ends with an error event. It stays one function because
// its deferred finish, cancel and stop registration must wrap every path
// the attempt takes.
func (p *Proxy) attempt(w http.ResponseWriter, r *http.Request, c *call, t *router.Ticket, canRetry bool) (f *failure, abort bool) {
	b := t.Backend
	a := &attempt{p: p, c: c, t: t, start: p.now(), out: router.Failed(0)}
	defer a.finish(r.Context())

	// The upstream request ends with the client's (when the client goes
	// away the transport closes the backend connection and the copy loop's
	// read fails at once), at the watchdog's deadlines, and at shutdown.
	ctx, cancel := context.WithCancelCause(p.traceAttempt(r.Context(), a)) // tracing.go: the attempt's span
	defer cancel(nil)
	a.cancel = cancel
	stop := p.stopShard()
	stop.add(a)
	defer stop.remove(a)
	a.wd = &a.dog
	a.dog.init(cancel)
	defer a.wd.stop()
	defer p.retried(c)
	a.wd.firstToken(p.firstTokenDeadline(c, t))

	res, err := p.transport.RoundTrip(traceUpstream(a, p.withCredentials(upstream.NewRequest(ctx, r, b.URL, c.body), b))) // security.go: credentials; tracing.go: traceparent
	if err != nil {
		cause := context.Cause(ctx)
		switch {
		case r.Context().Err() != nil:
			a.status = statusClientClosed
			return nil, false
		case cause == errShutdown && c.splice != nil:
			a.fail = ""
			return &failure{kind: "reset", err: cause}, false
		case cause == errShutdown:
			a.status = statusLabel(http.StatusServiceUnavailable)
			p.setRouteHeaders(w, &t.Decision)
			writeError(w, openai.Unavailable("kvroute is shutting down; retry"))
			return nil, false
		case cause == errFirstTokenTimeout:
			p.metrics.timeouts.WithLabelValues(b.Name, timeoutKind(c)).Inc()
			a.fail = "timeout"
			return &failure{kind: "timeout", err: cause}, false
		case isDialError(err):
			p.metrics.failures.WithLabelValues(b.Name, "dial").Inc()
			p.fleet.MarkFailed(b, err)
			a.fail = "dial"
			return &failure{kind: "dial", err: err}, false
		}
		p.metrics.failures.WithLabelValues(b.Name, "request").Inc()
		a.fail = "reset"
		return &failure{kind: "reset", err: err}, false
	}
	defer res.Body.Close()

	a.out.Status = res.StatusCode
	wait := retryAfter(res.Header)
	if res.StatusCode == http.StatusTooManyRequests {
		p.fleet.Backoff(b, time.Now().Add(cmp.Or(wait, backoffFor)))
	}
	if canRetry && retriableStatus(res.StatusCode) || c.holdable && res.StatusCode == http.StatusTooManyRequests ||
		c.splice != nil && res.StatusCode/100 != 2 { // a continuation's answer never goes to the client as it is
		p.metrics.failures.WithLabelValues(b.Name, "status").Inc()
		return &failure{kind: "status", status: res.StatusCode, retryAfter: wait}, false
	}
	a.status = statusLabel(res.StatusCode)
	// A continuation's headers went with the stream's first backend's.
	a.hw = heldWriter{ResponseWriter: w, status: res.StatusCode, header: res.Header, onSend: a, sent: c.splice != nil}
	hw := &a.hw
	p.setRouteHeaders(w, &t.Decision)
	stream, announced := responseHeaders(res)
	if c.splice != nil && !stream {
		// A continuation that is not a stream cannot be spliced into one.
		a.status, a.out.Status, a.fail = "", 0, "read"
		p.metrics.failures.WithLabelValues(b.Name, "status").Inc()
		return &failure{kind: "status", status: res.StatusCode}, false
	}
	if res.StatusCode/100 != 2 || res.ContentLength == 0 {
		hw.send() // an error or an empty body: nothing to wait for
	}

	var readErr, writeErr error
	a.body = idleReader{r: res.Body, a: a}
	body := &a.body
	if stream {
		a.sc = sse.Scanner{HideUsage: c.hideUsage, Rec: c.rec}
		sc := &a.sc
		var dst http.ResponseWriter = hw
		if c.splice != nil {
			dst = c.splice // splice.go: into the stream another backend began
		} else if c.ids != nil && res.StatusCode/100 == 2 {
			dst = newIDWriter(hw, sc, p.router, b, c.ids) // responseid.go
		}
		readErr, writeErr = a.ec.Copy(dst, body, sc, a)
		if readErr == nil && c.rec != nil && !sc.Done && !c.rec.Finished {
			readErr = errIncomplete
		}
		a.out.Tokens, a.out.ResponseID = sc.Tokens, sc.ResponseID
		if sc.SawUsage {
			a.setUsage(sc.Usage)
		}
	} else if c.ids != nil && res.StatusCode/100 == 2 {
		readErr, writeErr = a.copyResponse(hw, res, body) // responseid.go
	} else {
		readErr, writeErr = a.copyBody(hw, res, body)
	}
	switch {
	case writeErr != nil, readErr != nil && r.Context().Err() != nil:
		// The client went away; the deferred cancel ends the upstream
		// request (if the client's context did not already).
		a.status = statusClientClosed
		return nil, false
	case readErr != nil:
		return a.brokeOff(hw, context.Cause(ctx), readErr, stream, canRetry)
	}
	hw.send()
	a.complete = true
	copyTrailers(w.Header(), res.Trailer, announced)
	return nil, false
}

// brokeOff handles a response whose body failed (err) for cause (nil: the
// backend's own failure): retried if nothing reached the client, answered
// with an error if only the headers are held, ended with an error event if
// it is a stream under way; a non-streamed body cut short aborts.
func (a *attempt) brokeOff(hw *heldWriter, cause, err error, stream, canRetry bool) (*failure, bool) {
	p, b := a.p, a.t.Backend
	kind, why := "read", "backend "+b.Name+" failed mid-response ("+describe(err)+")"
	e := &apiError{Status: http.StatusBadGateway, Type: typeServer, Code: codeBackendError}
	switch cause {
	case errFirstTokenTimeout:
		kind, why = "first_token", "backend "+b.Name+" sent no first token in time"
		e.Status, e.Code = http.StatusGatewayTimeout, codeBackendTimeout
	case errIdleTimeout:
		kind, why = "idle", "backend "+b.Name+" stalled mid-response"
		e.Status, e.Code = http.StatusGatewayTimeout, codeBackendTimeout
	case errShutdown:
		kind, why = "shutdown", "kvroute is shutting down"
		e.Status, e.Code = http.StatusServiceUnavailable, codeUnavailable
	}
	e.Message = why
	if kind == "first_token" || kind == "idle" {
		p.metrics.timeouts.WithLabelValues(b.Name, kind).Inc()
	} else if kind == "read" {
		p.metrics.failures.WithLabelValues(b.Name, "read").Inc()
	}
	a.fail = "read"
	if kind == "first_token" || kind == "idle" {
		a.fail = "timeout"
	} else if kind == "shutdown" {
		a.fail = ""
	}
	sent := hw.sent && (a.c.splice == nil || !a.c.splice.firstAt.IsZero())
	if !sent {
		a.out.Status = 0 // nothing usable came back
		if canRetry && kind != "shutdown" || a.c.splice != nil {
			f := &failure{kind: "reset", err: err}
			if kind == "first_token" || kind == "idle" {
				f = &failure{kind: "timeout", err: cause}
			}
			a.status = ""
			return f, false
		}
		a.status = statusLabel(e.Status)
		hw.ResponseWriter.Header().Del("Trailer")
		writeError(hw.ResponseWriter, e)
		return nil, false
	}
	a.status = statusLabel(e.Status)
	p.metrics.cut.WithLabelValues(b.Name, kind).Inc()
	if !stream {
		p.log.Warn("backend failed mid-response, aborting the client connection", "request_id", a.c.id, "backend", b.Name, "reason", kind, "err", err)
		return nil, true
	}
	// A stream under way ends with an OpenAI-shaped error event and the
	// end-of-stream marker, as vLLM ends a stream that fails: the client
	// sees why, and its stream ends cleanly rather than being cut. It
	// first tries to continue on another backend (migrate.go).
	if f := a.cut(kind, err, e); f != nil {
		return f, false
	}
	p.log.Warn("stream cut, ending it with an error event", "request_id", a.c.id, "backend", b.Name, "reason", kind, "err", err)
	if _, werr := hw.Write(cutEvent(a.c.ep, e)); werr == nil {
		_ = hw.FlushError()
	}
	return nil, false
}

// cut returns the failure of a stream cut after its first bytes (kind, err
// as brokeOff has them) that may continue on another backend; nil when it
// cannot (not recorded for it, or kvroute is stopping).
func (a *attempt) cut(kind string, err error, e *apiError) *failure {
	rec := a.c.rec
	if rec == nil || (kind != "read" && kind != "idle") {
		return nil
	}
	f := &failure{kind: "reset", err: err, cut: true, cause: causeReset, at: a.p.now(), event: cutEvent(a.c.ep, e)}
	a.out.Status = e.Status // the ticket finishes as failed: no pin to a response cut short
	switch {
	case kind == "idle":
		f.kind, f.cause = "timeout", causeIdle
	case errors.Is(err, sse.ErrErrorEvent):
		// The backend's own error event ends the stream if it cannot
		// continue.
		f.cause = causeErrorEvent
		f.event = append(append(append([]byte("data: "), rec.Failed...), "\n\n"...), "data: [DONE]\n\n"...)
	case errors.Is(err, errIncomplete):
		f.cause = causeIncomplete
	}
	return f
}

// timeoutKind is the kvroute_timeouts_total kind of c's first deadline:
// a stream's first token, or a non-streamed response's answer.
func timeoutKind(c *call) string {
	if c.stream {
		return "first_token"
	}
	return "response"
}

// FirstToken marks the first content of the response: the backend is done
// with the prefill.
func (a *attempt) FirstToken() {
	if a.first {
		return
	}
	a.first = true
	a.out.TTFT = a.p.now().Sub(a.start)
	a.t.FirstToken()
	a.wd.idle(a.p.res.StreamIdleTimeout)
}

func (a *attempt) setUsage(u sse.Usage) {
	a.out.PromptTokens, a.out.CachedTokens, a.out.CompletionTokens = u.Prompt, u.Cached, u.Completion
}

// finish releases the attempt's load and records its outcome: metrics, the
// policy's feedback, the debug log line.
func (a *attempt) finish(ctx context.Context) {
	p, d, o := a.p, &a.t.Decision, &a.out
	o.Latency = p.now().Sub(a.start)
	a.report()
	name, model := d.Backend.Name, cmp.Or(a.c.model, noBackend)
	m := p.metrics
	if a.status != "" {
		m.requests.WithLabelValues(name, a.status, d.Reason, model).Inc()
	}
	if a.c.req != nil {
		if a.complete && o.Status/100 == 2 {
			if a.first {
				m.ttft.WithLabelValues(name, model).Observe(o.TTFT.Seconds())
			}
			m.e2e.WithLabelValues(name, model).Observe(o.Latency.Seconds())
		}
		if o.CachedTokens >= 0 {
			m.predicted.WithLabelValues(name).Add(float64(d.Cached))
			m.reported.WithLabelValues(name).Add(float64(o.CachedTokens))
		}
		if o.PromptTokens >= 0 {
			m.prompt.WithLabelValues(name).Add(float64(o.PromptTokens))
		}
	}
	a.t.Finish(*o)
	traceAttemptEnd(a) // tracing.go
	if p.log.Enabled(ctx, slog.LevelDebug) {
		p.log.LogAttrs(ctx, slog.LevelDebug, "request", slog.String("request_id", a.c.id),
			slog.String("backend", name),
			slog.String("reason", d.Reason),
			slog.String("status", a.status),
			slog.Int("predicted_prompt_tokens", a.t.Request().PromptTokens),
			slog.Int("predicted_cached_tokens", d.Cached),
			slog.Int("prompt_tokens", o.PromptTokens),
			slog.Int("cached_tokens", o.CachedTokens),
			slog.Int("completion_tokens", o.CompletionTokens),
			slog.Any("scores", d.Scores),
			slog.Duration("ttft", o.TTFT),
			slog.Duration("latency", o.Latency))
	}
}

// report tells the fleet how the attempt went, for outlier ejection and
// backoff: a client that left says nothing of the backend; a timeout or a
// gateway error is the proxy's own finding; an answer is classified by
// fleet.ResultOf, as the endpoint picker classifies its own.
func (a *attempt) report() {
	p, b, o := a.p, a.t.Backend, &a.out
	switch {
	case a.status == statusClientClosed:
		return
	case a.fail == "timeout":
		p.fleet.Report(b, fleet.Result{Kind: fleet.ResultTimeout})
		return
	case a.fail != "":
		p.fleet.Report(b, fleet.Result{Kind: fleet.ResultGatewayError})
		return
	}
	var ttft, predicted time.Duration
	if a.c.stream && a.first {
		ttft, predicted = o.TTFT, a.t.PredictedTTFT
	}
	if r, ok := fleet.ResultOf(o.Status, a.complete, ttft, predicted); ok {
		p.fleet.Report(b, r)
	}
}

// Non-streaming chat, completion and Responses API bodies are kept, up to maxCaptureBytes,
// to read their usage; buffers that grew past maxPooledCapture are not
// pooled.
const (
	maxCaptureBytes  = 8 << 20
	maxPooledCapture = 1 << 20
)

var captures = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// bodyBufs are the copy buffers of bodies that are not event streams.
var bodyBufs = sync.Pool{New: func() any { b := make([]byte, 8<<10); return &b }}

// copyBody copies a response that is not an event stream, as it arrives
// (flushing after every write when its length is unknown, as a stream of
// another kind may be). For a successful chat or completion response it
// keeps a copy of the body and reads the usage from it at the end.
func (a *attempt) copyBody(w http.ResponseWriter, res *http.Response, body io.Reader) (readErr, writeErr error) {
	bp := bodyBufs.Get().(*[]byte)
	defer bodyBufs.Put(bp)
	buf := *bp
	var capture *bytes.Buffer
	keep := a.c.req != nil && res.StatusCode/100 == 2
	if keep {
		capture = captures.Get().(*bytes.Buffer)
		capture.Reset()
		defer func() {
			if capture.Cap() <= maxPooledCapture {
				captures.Put(capture)
			}
		}()
	}
	flushEach := res.ContentLength < 0
	rc := sse.FlusherOf(w)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			a.FirstToken()
			if keep = keep && capture.Len()+n <= maxCaptureBytes; keep {
				capture.Write(buf[:n])
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return nil, werr
			}
			if flushEach {
				if werr := sse.Flush(rc); werr != nil {
					return nil, werr
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err, nil
		}
	}
	if keep {
		parse := sse.ParseUsage
		if a.c.ep == request.Messages {
			parse = sse.ParseMessagesUsage
		}
		if u, ok := parse(jsonscan.Field(capture.Bytes(), "usage")); ok {
			a.setUsage(u)
		}
		if a.c.ep == request.Responses {
			a.out.ResponseID = jsonscan.StringValue(jsonscan.Field(capture.Bytes(), "id"))
		}
	}
	return nil, nil
}
