package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// maxAttempts bounds the backends one request tries: the first pick, and one
// more when that backend refuses the connection.
const maxAttempts = 2

// reasonLeastRequest is the route of requests the proxy routes by load.
const reasonLeastRequest = "least-request"

// statusClientClosed is the status label of a request whose client went away
// before the response was complete (nginx's 499).
const statusClientClosed = "499"

// call is one client request on its way to a backend.
type call struct {
	ep router.Endpoint
	// req is the request's facts; nil for the endpoints the policy does not
	// route (embeddings and others), which are neither timed as
	// generations nor reported to the policy.
	req *router.Request
	// body is what goes upstream.
	body []byte
	// hideUsage is set when the proxy turned on stream_options.include_usage
	// for a client that did not ask: its usage chunk is not forwarded.
	hideUsage bool
}

// forward sends c to a backend picked among cands and copies the response
// back. A backend that refuses the connection is marked failed and the
// request goes to another candidate, once.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, c *call, cands []*fleet.Backend) {
	for n := 1; ; n++ {
		t, e := p.route(c, cands)
		if e != nil {
			p.reject(w, e)
			return
		}
		dialErr, abort := p.attempt(w, r, c, t)
		if abort {
			// Headers are sent, the body is cut short: all that is left is to
			// break the client's connection so it cannot take the truncated
			// response for a complete one.
			panic(http.ErrAbortHandler)
		}
		if dialErr == nil {
			return
		}
		b := t.Backend
		p.fleet.MarkFailed(b, dialErr)
		cands = router.Without(cands, b)
		if n == maxAttempts || len(cands) == 0 {
			p.log.Warn("backend unreachable, giving up", "backend", b.Name, "attempts", n, "err", dialErr)
			p.metrics.requests.WithLabelValues(b.Name, statusLabel(http.StatusBadGateway), t.Reason).Inc()
			setRouteHeaders(w, &t.Decision)
			writeError(w, unreachable(b.Name, dialErr))
			return
		}
		p.log.Warn("backend unreachable, retrying on another", "backend", b.Name, "err", dialErr)
	}
}

// route asks the policy for a backend for a chat or completion request, and
// picks the least loaded one for other requests; either way the request is
// counted there until its ticket is finished.
func (p *Proxy) route(c *call, cands []*fleet.Backend) (*router.Ticket, *apiError) {
	if c.req == nil {
		t, err := p.byLoad.Route(&router.Request{Endpoint: c.ep}, cands)
		if err != nil {
			return nil, unavailable("no backend can take the request: %v", err)
		}
		return t, nil
	}
	t0 := p.now()
	t, err := p.router.Route(c.req, cands)
	p.metrics.decision.Observe(p.now().Sub(t0).Seconds())
	switch {
	case errors.Is(err, router.ErrNoBackend):
		return nil, unavailable("no backend can take the request: %v", err)
	case err != nil:
		return nil, internal("routing policy %s failed: %v", p.router.Name(), err)
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

// attempt is one try of a call at one backend: its ticket (its share of the
// backend's load, counted when it was routed), its timing and its outcome.
// finish records everything and finishes the ticket; the prefill part of
// the load is released at the first token.
type attempt struct {
	p     *Proxy
	c     *call
	t     *router.Ticket
	start time.Time
	// first is set at the first token; complete when the response was
	// copied to its end.
	first, complete bool
	// status is the requests_total status label; "" if the attempt is not
	// counted (a refused connection is retried).
	status string
	out    router.Outcome
}

// attempt forwards c to t's backend and copies the response to w. It
// returns the dial error if the backend could not be reached (nothing was
// written to w, the caller may retry), and abort if the backend failed after
// the response headers were sent.
func (p *Proxy) attempt(w http.ResponseWriter, r *http.Request, c *call, t *router.Ticket) (dialErr error, abort bool) {
	b := t.Backend
	d := &t.Decision
	a := &attempt{p: p, c: c, t: t, start: p.now(), out: router.Failed(0)}
	defer a.finish(r.Context())
	// The upstream request ends with the client's: when the client goes
	// away its context is cancelled, the transport closes the backend
	// connection and the copy loop's read fails at once.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	res, err := p.transport.RoundTrip(p.upstream(upstreamRequest(ctx, r, b, c.body), b)) // security.go: credentials
	if err != nil {
		switch {
		case r.Context().Err() != nil:
			a.status = statusClientClosed
		case isDialError(err):
			p.metrics.failures.WithLabelValues(b.Name, "dial").Inc()
			return err, false
		default:
			p.metrics.failures.WithLabelValues(b.Name, "request").Inc()
			p.log.Warn("backend request failed", "backend", b.Name, "err", err)
			a.status = statusLabel(http.StatusBadGateway)
			setRouteHeaders(w, d)
			writeError(w, backendFailed(b.Name, err))
		}
		return nil, false
	}
	defer res.Body.Close()

	a.out.Status = res.StatusCode
	a.status = statusLabel(res.StatusCode)
	removeHopHeaders(res.Header)
	h := w.Header()
	for k, vv := range res.Header {
		h[k] = vv
	}
	setRouteHeaders(w, d)
	stream := isEventStream(res.Header.Get("Content-Type"))
	if stream {
		h.Del("Content-Length") // events may be dropped or edited
	}
	announced := len(res.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range res.Trailer {
			keys = append(keys, k)
		}
		h.Add("Trailer", strings.Join(keys, ", "))
	}
	w.WriteHeader(res.StatusCode)

	var readErr, writeErr error
	if stream {
		sc := eventScanner{hideUsage: c.hideUsage}
		// Send the headers now: a client waits for them before it
		// waits for the first event.
		if writeErr = flush(http.NewResponseController(w)); writeErr == nil {
			readErr, writeErr = copyEvents(w, res.Body, &sc, a.firstToken)
		}
		a.out.Tokens = sc.tokens
		if sc.sawUsage {
			a.setUsage(sc.usage)
		}
	} else {
		readErr, writeErr = a.copyBody(w, res)
	}
	switch {
	case writeErr != nil, readErr != nil && r.Context().Err() != nil:
		// The client went away; the deferred cancel ends the upstream
		// request (if the client's context did not already).
		a.status = statusClientClosed
		return nil, false
	case readErr != nil:
		p.metrics.failures.WithLabelValues(b.Name, "read").Inc()
		p.log.Warn("backend failed mid-response, aborting the client connection",
			"backend", b.Name, "err", readErr)
		a.status = statusLabel(http.StatusBadGateway)
		return nil, true
	}
	a.complete = true

	// As httputil.ReverseProxy does: trailers announced in the header go
	// out under their names, others with the TrailerPrefix.
	if len(res.Trailer) > 0 {
		if len(res.Trailer) == announced {
			for k, vv := range res.Trailer {
				h[k] = vv
			}
		} else {
			for k, vv := range res.Trailer {
				h[http.TrailerPrefix+k] = vv
			}
		}
	}
	return nil, false
}

// firstToken marks the first content of the response: the backend is done
// with the prefill.
func (a *attempt) firstToken() {
	if a.first {
		return
	}
	a.first = true
	a.out.TTFT = a.p.now().Sub(a.start)
	a.t.FirstToken()
}

func (a *attempt) setUsage(u usage) {
	a.out.PromptTokens, a.out.CachedTokens, a.out.CompletionTokens = u.prompt, u.cached, u.completion
}

// finish releases the attempt's load and records its outcome: metrics, the
// policy's feedback, the debug log line.
func (a *attempt) finish(ctx context.Context) {
	p, d, o := a.p, &a.t.Decision, &a.out
	o.Latency = p.now().Sub(a.start)
	name := d.Backend.Name
	m := p.metrics
	if a.status != "" {
		m.requests.WithLabelValues(name, a.status, d.Reason).Inc()
	}
	if a.c.req != nil {
		if a.complete && o.Status/100 == 2 {
			if a.first {
				m.ttft.WithLabelValues(name).Observe(o.TTFT.Seconds())
			}
			m.e2e.WithLabelValues(name).Observe(o.Latency.Seconds())
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
	if p.log.Enabled(ctx, slog.LevelDebug) {
		p.log.LogAttrs(ctx, slog.LevelDebug, "request",
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

// Non-streaming chat and completion bodies are kept, up to maxCaptureBytes,
// to read their usage; buffers that grew past maxPooledCapture are not
// pooled.
const (
	maxCaptureBytes  = 8 << 20
	maxPooledCapture = 1 << 20
)

var captures = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// copyBody copies a response that is not an event stream, as it arrives
// (flushing after every write when its length is unknown, as a stream of
// another kind may be). For a successful chat or completion response it
// keeps a copy of the body and reads the usage from it at the end.
func (a *attempt) copyBody(w http.ResponseWriter, res *http.Response) (readErr, writeErr error) {
	bp := streamBufs.Get().(*[]byte)
	defer streamBufs.Put(bp)
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
	rc := http.NewResponseController(w)
	for {
		n, err := res.Body.Read(buf)
		if n > 0 {
			a.firstToken()
			if keep = keep && capture.Len()+n <= maxCaptureBytes; keep {
				capture.Write(buf[:n])
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return nil, werr
			}
			if flushEach {
				if werr := flush(rc); werr != nil {
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
		if u, ok := parseUsage(field(capture.Bytes(), "usage")); ok {
			a.setUsage(u)
		}
	}
	return nil, nil
}

// upstreamRequest builds the request to backend b for the client's request
// in, with body as its body, bound to ctx.
func upstreamRequest(ctx context.Context, in *http.Request, b *fleet.Backend, body []byte) *http.Request {
	u := *b.URL
	u.Path = joinPath(b.URL.Path, in.URL.Path)
	u.RawPath = ""
	u.RawQuery = in.URL.RawQuery
	u.Fragment = ""
	var rd io.Reader
	if len(body) > 0 {
		rd = bytes.NewReader(body) // sets GetBody: the transport may resend it on a stale connection
	}
	out, _ := http.NewRequestWithContext(ctx, in.Method, "", rd) // "" parses; the method was valid on the way in
	out.URL = &u
	out.Host = ""

	out.Header = in.Header.Clone()
	removeHopHeaders(out.Header)
	if wantsTrailers(in.Header) {
		out.Header.Set("Te", "trailers")
	}
	// The proxy reads usage from the bodies: ask for them uncompressed.
	out.Header.Del("Accept-Encoding")
	out.Header.Del("Content-Length")
	out.Header.Del("Expect") // the body is here already
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header.Set("User-Agent", "") // not Go's default
	}
	if ip, _, err := net.SplitHostPort(in.RemoteAddr); err == nil {
		if prior := out.Header.Values("X-Forwarded-For"); len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		out.Header.Set("X-Forwarded-For", ip)
	}
	// A kept-alive connection the backend closed while idle fails the
	// request before the backend read it (llama-server closes them after 5
	// s); the transport resends only requests it may repeat. This one it
	// may: an empty key marks it so without sending the header.
	_, key := out.Header["Idempotency-Key"]
	_, xkey := out.Header["X-Idempotency-Key"]
	if !key && !xkey {
		out.Header["X-Idempotency-Key"] = nil
	}
	return out
}

// joinPath puts the request path under the backend URL's path prefix.
func joinPath(prefix, path string) string {
	prefix = strings.TrimSuffix(prefix, "/")
	if prefix == "" {
		return path
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return prefix + path
}

// hopHeaders are the hop-by-hop headers, as httputil.ReverseProxy lists
// them: they concern one connection, not the request.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// removeHopHeaders removes the hop-by-hop headers from h, and the headers
// its Connection header names.
func removeHopHeaders(h http.Header) {
	for _, f := range h["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = strings.TrimSpace(sf); sf != "" {
				h.Del(sf)
			}
		}
	}
	for _, f := range hopHeaders {
		h.Del(f)
	}
}

func wantsTrailers(h http.Header) bool {
	for _, v := range h["Te"] {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "trailers") {
				return true
			}
		}
	}
	return false
}

func setRouteHeaders(w http.ResponseWriter, d *router.Decision) {
	h := w.Header()
	h.Set(HeaderBackend, d.Backend.Name)
	h.Set(HeaderRoute, d.Reason)
}

// isEventStream reports whether the content type ct is text/event-stream.
func isEventStream(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

// statusLabel is the requests_total label of an HTTP status.
func statusLabel(code int) string { return strconv.Itoa(code) }
