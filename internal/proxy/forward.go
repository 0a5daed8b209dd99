package proxy

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/sse"
)

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
	// rec records the stream for its continuation elsewhere should its
	// backend fail mid-way (migrate.go); nil when it cannot continue.
	rec *sse.Record
	// splice is set once the stream continues on another backend: the
	// attempts write through it; migrations counts them.
	splice     *splice
	migrations int
	// ids, for a Responses API request, maps its response ids between the
	// backend and the client (responseid.go); nil for others.
	ids *responseIDs
	// prefills are the prefill servers a chat or completion request may be
	// prefilled on first (disagg.go); nil when there are none. whole is
	// the body without SGLang's bootstrap room (sglang.go), which a retry
	// goes back to.
	prefills []*fleet.Backend
	whole    []byte
}

// forward sends c to a backend picked among cands and copies the response
// back. An attempt that fails before anything reached the client (the
// backend unreachable, its connection reset, a 429/502/503/504, no first
// token in time) is retried on another candidate, within MaxAttempts and the
// retry budget; once a byte reached the client the request is never resent.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, c *call, cands []*fleet.Backend) {
	c.id = requestID(r)
	p.traceCall(r, c) // tracing.go: model and session on the request's span
	p.budget.start()
	defer p.budget.active.Add(-1)
	var last *failure
	var lastTicket *router.Ticket
	var failed []*fleet.Backend // the backends tried in vain, which a cut stream does not go back to
	for n := 1; ; n++ {
		t, e := p.tracedRoute(r.Context(), c, cands) // tracing.go: p.route in a span
		if e != nil {
			if last != nil {
				p.giveUp(w, lastTicket, last, n-1)
			} else {
				p.rejectFor(w, e, c.model)
			}
			return
		}
		if n == 1 && !c.held && p.missesDeadline(w, t, c.deadline) {
			return
		}
		if n == 1 && c.prefills != nil {
			p.disaggregate(r, c, t) // disagg.go: the prefill leg, before the decode's attempt
		} else if c.whole != nil {
			c.body, c.whole = c.whole, nil // sglang.go: the room was the first decode server's
		}
		more := n < p.res.MaxAttempts && len(cands) > 1
		c.holdable = c.req != nil && !c.held
		f, abort := p.attempt(w, r, c, t, more && p.budget.allows())
		if abort {
			// Headers are sent, the body is cut short: all that is left is to
			// break the client's connection so it cannot take the truncated
			// response for a complete one.
			panic(http.ErrAbortHandler)
		}
		if f == nil {
			return
		}
		if f.cut {
			p.migrate(w, r, c, t, f, failed) // migrate.go
			return
		}
		failed = append(failed, t.Backend)
		last, lastTicket = f, t
		cands = router.Without(cands, t.Backend)
		if f.kind == "status" && f.status == http.StatusTooManyRequests && !more && c.holdable {
			// Every backend this request could try is full for now: hold it
			// for the Retry-After, once, then try those that are back.
			if cands = p.hold(r, c, f); len(cands) == 0 {
				p.giveUp(w, t, f, n)
				return
			}
			p.metrics.retries.WithLabelValues(t.Backend.Name, "held").Inc()
			n = 0
			continue
		}
		// A refused connection loads no backend: its retry is free.
		free := f.kind == "dial"
		if !more || r.Context().Err() != nil || (!free && !p.budget.acquire()) {
			p.giveUp(w, t, f, n)
			return
		}
		c.retrying = !free
		p.metrics.retries.WithLabelValues(t.Backend.Name, f.kind).Inc()
		p.log.Warn("backend failed before answering, retrying on another",
			"request_id", c.id, "backend", t.Backend.Name, "reason", f.kind, "status", f.status, "attempt", n, "err", f.err)
	}
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
	p.priceSplit(c) // disagg.go
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

// failure is why an attempt got no answer that could go to the client:
// nothing of it was sent, so another backend may take the request.
type failure struct {
	// kind is the metrics' reason: "dial", "reset", "timeout" or "status".
	kind   string
	status int // the backend's status, for "status"
	// retryAfter is the backend's Retry-After, for a 429 or 503.
	retryAfter time.Duration
	err        error
	// cut is set when the failure came after the stream's first bytes
	// reached the client, and it may continue elsewhere (migrate.go):
	// cause says how (a kvroute_migrations_total cause), at when, and
	// event is what ends the client's stream if it cannot.
	cut   bool
	cause string
	at    time.Time
	event []byte
}

// retriableStatus reports whether a backend's status means it did not
// serve the request and another may: overloaded (429), failed inside (500:
// a generation is safe to repeat before its first byte, and a request that
// fails everywhere fails within MaxAttempts), or a gateway in front of it,
// or the server itself, unable to serve (502, 503, 504).
func retriableStatus(code int) bool {
	switch code {
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// retryAfter reads a Retry-After header in seconds (the form inference
// servers use); 0 when absent or not a number.
func retryAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0 // and no error of Atoi's to allocate, as nearly every response
	}
	s, err := strconv.Atoi(v)
	if err != nil || s <= 0 {
		return 0
	}
	return time.Duration(min(s, 3600)) * time.Second
}

// maxHold bounds how long a request whose every candidate answered 429 is
// held for their Retry-After: past a few seconds the client is better told.
const maxHold = 5 * time.Second

// hold waits out f's Retry-After (1 s if it gave none, at most maxHold),
// unless the client leaves or the proxy stops first, and returns the
// candidates for c's model then; none if it did not wait.
func (p *Proxy) hold(r *http.Request, c *call, f *failure) []*fleet.Backend {
	c.held = true
	wait := min(cmp.Or(f.retryAfter, backoffFor), maxHold) + 50*time.Millisecond // past the backoff's end
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		return nil
	case <-p.stop.Done():
		return nil
	}
	return p.fleet.Candidates(nil, c.req.Model)
}

// giveUp answers a request whose last attempt, at t's backend, failed with
// f after n attempts in all.
func (p *Proxy) giveUp(w http.ResponseWriter, t *router.Ticket, f *failure, n int) {
	name := t.Backend.Name
	e := &apiError{Status: http.StatusBadGateway, Type: typeServer, Code: codeBackendError}
	switch f.kind {
	case "dial":
		e.Code = codeBackendUnreachable
		e.Message = "backend " + name + " is unreachable (" + describe(f.err) + ")"
	case "timeout":
		e.Status, e.Code = http.StatusGatewayTimeout, codeBackendTimeout
		e.Message = "backend " + name + " did not answer in time: " + f.err.Error()
	case "status":
		e.Status = f.status
		e.Message = "backend " + name + " answered " + strconv.Itoa(f.status) + " " + http.StatusText(f.status)
		if f.status == http.StatusTooManyRequests {
			e.Type, e.Code = typeRequests, codeRateLimited
		}
	default:
		e.Message = "backend " + name + " failed before answering (" + describe(f.err) + ")"
	}
	if n > 1 {
		e.Message += " after " + strconv.Itoa(n) + " attempts"
	}
	if f.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((f.retryAfter+time.Second-1)/time.Second)))
	}
	p.log.Warn("request failed", "request_id", w.Header().Get(HeaderRequestID), "backend", name, "reason", f.kind, "status", e.Status, "attempts", n, "err", f.err)
	p.metrics.requests.WithLabelValues(name, statusLabel(e.Status), t.Reason, cmp.Or(t.Request().Model, noBackend)).Inc()
	p.setRouteHeaders(w, &t.Decision)
	writeError(w, e)
}

// describe names a connection error without the backend's address, which
// clients are not told.
func describe(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, errFirstTokenTimeout), errors.Is(err, errIdleTimeout):
		return "timed out"
	case err == nil:
		return "no answer"
	}
	return "connection failed"
}

// setRouteHeaders names the chosen backend and the reason on the response,
// with the TTFT the request was routed on, and with Config.Explain the
// predicted cached tokens, the TTFT's interval and the time between tokens.
func (p *Proxy) setRouteHeaders(w http.ResponseWriter, d *router.Decision) {
	h := w.Header()
	vv := []string{d.Backend.Name, d.Reason} // one allocation for both: never appended to
	h[HeaderBackend], h[HeaderRoute] = vv[:1:1], vv[1:]
	if d.PredictedTTFT <= 0 {
		return
	}
	h[HeaderPredictedTTFTSeconds] = []string{strconv.FormatFloat(d.PredictedTTFT.Seconds(), 'f', 4, 64)}
	if p.explain {
		h.Set(HeaderPredictedCached, strconv.Itoa(d.Cached))
		h.Set(HeaderPredictedTTFT, strconv.FormatFloat(float64(d.PredictedTTFT)/float64(time.Millisecond), 'f', 1, 64))
		if d.PredictedTTFTHigh > 0 {
			h.Set(HeaderPredictedTTFTInterval, strconv.FormatFloat(d.PredictedTTFTLow.Seconds(), 'f', 4, 64)+" "+
				strconv.FormatFloat(d.PredictedTTFTHigh.Seconds(), 'f', 4, 64))
		}
		if d.PredictedITL > 0 {
			h.Set(HeaderPredictedITL, strconv.FormatFloat(d.PredictedITL.Seconds(), 'f', 5, 64))
		}
	}
}
