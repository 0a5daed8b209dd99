package proxy

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/jsonscan"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/sse"
)

// reasonLeastRequest is the route of requests the proxy routes by load.
const reasonLeastRequest = "least-request"

// statusClientClosed is the status label of a request whose client went away
// before the response was complete (nginx's 499).
const statusClientClosed = "499"

// call is one client request on its way to a backend.
type call struct {
	ep request.Endpoint
	// req is the request's facts; nil for the endpoints the policy does not
	// route (embeddings and others), which are neither timed as
	// generations nor reported to the policy.
	req *router.Request
	// body is what goes upstream.
	body []byte
	// stream is set when the client asked for a streamed response.
	stream bool
	// deadline is the time to first token the client grants; 0 for none.
	deadline time.Duration
	// retrying is set while the request holds a retry of the budget: from
	// a failed attempt until the next one answers or fails.
	retrying bool
	// holdable is set while a 429 from the last backend tried may be held
	// (hold) rather than passed on; held once it was.
	holdable, held bool
	// hideUsage is set when the proxy turned on stream_options.include_usage
	// for a client that did not ask: its usage chunk is not forwarded.
	hideUsage bool
	// id is the request's ID (requestid.go), in every log line about it.
	id string
	// model is the request's model, "" if it named none the candidates
	// serve: the model label of its metrics.
	model string
}

// route asks the policy for a backend for a chat or completion request, and
// picks the least loaded one for other requests; either way the request is
// counted there until its ticket is finished.
func (p *Proxy) route(c *call, cands []*fleet.Backend) (*router.Ticket, *apiError) {
	if c.req == nil {
		t, err := p.byLoad.Route(&router.Request{Model: c.model}, cands)
		if err != nil {
			return nil, openai.Unavailable("no backend can take the request: %v", err)
		}
		return t, nil
	}
	t0 := p.now()
	t, err := p.router.Route(c.req, cands)
	p.metrics.decision.Observe(p.now().Sub(t0).Seconds())
	switch {
	case errors.Is(err, router.ErrNoBackend):
		return nil, openai.Unavailable("no backend can take the request: %v", err)
	case err != nil:
		return nil, openai.Internal("routing policy %s failed: %v", p.router.Name(), err)
	}
	return t, nil
}

// byLoad is the policy of the requests the proxy routes by load alone: the
// candidate with the fewest requests in flight, uniformly at random among
// ties so that an idle fleet spreads its load.
type byLoad struct{ rand func(int) int }

func (byLoad) Name() string { return reasonLeastRequest }

func (l byLoad) Pick(_ *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	b := router.LeastLoaded(cands, l.rand)
	if b == nil {
		return router.Decision{}, router.ErrNoBackend
	}
	return router.Decision{Backend: b, Reason: reasonLeastRequest}, nil
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
	a.traceEnd() // tracing.go
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
		if u, ok := sse.ParseUsage(jsonscan.Field(capture.Bytes(), "usage")); ok {
			a.setUsage(u)
		}
		if a.c.ep == request.Responses {
			a.out.ResponseID = jsonscan.StringValue(jsonscan.Field(capture.Bytes(), "id"))
		}
	}
	return nil, nil
}

// The headers Config.Explain adds, for policies that predict: the prompt
// tokens expected cached on the chosen backend, and the time to first token
// expected there, in milliseconds.
const (
	HeaderPredictedCached = "X-Kvroute-Predicted-Cached"
	HeaderPredictedTTFT   = "X-Kvroute-Predicted-Ttft-Ms"
)

func (p *Proxy) setRouteHeaders(w http.ResponseWriter, d *router.Decision) {
	h := w.Header()
	vv := []string{d.Backend.Name, d.Reason} // one allocation for both: never appended to
	h[HeaderBackend], h[HeaderRoute] = vv[:1:1], vv[1:]
	if p.explain && d.PredictedTTFT > 0 {
		h.Set(HeaderPredictedCached, strconv.Itoa(d.Cached))
		h.Set(HeaderPredictedTTFT, strconv.FormatFloat(float64(d.PredictedTTFT)/float64(time.Millisecond), 'f', 1, 64))
	}
}

// statusLabel is the requests_total label of an HTTP status.
func statusLabel(code int) string {
	if code >= 100 && code < 100+len(statusLabels) {
		return statusLabels[code-100] // strconv.Itoa would allocate one for every request
	}
	return strconv.Itoa(code)
}

// statusLabels are the labels of statuses 100 to 599.
var statusLabels = func() (l [500]string) {
	for i := range l {
		l[i] = strconv.Itoa(100 + i)
	}
	return l
}()
