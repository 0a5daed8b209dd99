package proxy

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/upstream"
)

// Defaults of Resilience. Each is in docs/operations.md with its reason.
const (
	// DefaultFirstTokenFloor and DefaultFirstTokenFactor make a streamed
	// request's first-token deadline floor + factor × the policy's
	// predicted TTFT: a hung backend is noticed in seconds, a 100k-token
	// prompt predicted to take 10 s gets 55 s.
	DefaultFirstTokenFloor  = 15 * time.Second
	DefaultFirstTokenFactor = 4.0
	// DefaultStreamIdleTimeout ends a stream whose backend sent nothing for
	// this long after its first token (nginx's proxy_read_timeout): decode
	// steps take milliseconds, a preemption seconds.
	DefaultStreamIdleTimeout = 60 * time.Second
	// DefaultResponseTimeout bounds the wait for a non-streamed response's
	// headers, which a backend sends only when the whole generation is done.
	DefaultResponseTimeout = 10 * time.Minute
	// DefaultMaxAttempts is how many backends one request may try before
	// its first byte reaches the client.
	DefaultMaxAttempts = 3
	// DefaultRetryBudget and DefaultRetryBudgetMin bound the retries pending
	// to half the requests in flight, but at least 3: a fleet that lost one
	// backend in three still places every request, while a fleet failing
	// as a whole sees at most 1.5 times its load. (Envoy's budget is 20 %
	// of active requests; a backend's death fails a third of them at once.)
	DefaultRetryBudget    = 0.5
	DefaultRetryBudgetMin = 3
	// DefaultBodyReadTimeout bounds reading a request's body: 32 MiB at
	// a slow client's 1 MB/s, and no slow-body connection held forever.
	DefaultBodyReadTimeout = 60 * time.Second
)

// fallbackPrefillRate is the prefill speed, in tokens a second, assumed for
// the first-token deadline when the policy predicts no TTFT: a sixth of an
// H100's on an 8B model, so that only a hung backend misses it (a small
// model on CPUs is slower, but its prompts are short: the floor covers it).
const fallbackPrefillRate = 5000.0

// Resilience configures the proxy's timeouts and retries. Zero values take
// the defaults; negative durations turn that timeout off.
type Resilience struct {
	// FirstTokenFloor and FirstTokenFactor give a streamed request's
	// deadline for its first token: floor + factor × predicted TTFT.
	FirstTokenFloor  time.Duration
	FirstTokenFactor float64
	// StreamIdleTimeout ends a response whose backend sent nothing for
	// this long after the first token.
	StreamIdleTimeout time.Duration
	// ResponseTimeout bounds the wait for a non-streamed response's first
	// byte.
	ResponseTimeout time.Duration
	// MaxAttempts bounds the backends a request tries.
	MaxAttempts int
	// RetryBudget is the fraction of requests in flight that may be
	// retrying at once; RetryBudgetMin the retries always allowed.
	RetryBudget    float64
	RetryBudgetMin int
	// BodyReadTimeout bounds reading a request body.
	BodyReadTimeout time.Duration
}

func (r Resilience) withDefaults() Resilience {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&r.FirstTokenFloor, DefaultFirstTokenFloor)
	def(&r.StreamIdleTimeout, DefaultStreamIdleTimeout)
	def(&r.ResponseTimeout, DefaultResponseTimeout)
	def(&r.BodyReadTimeout, DefaultBodyReadTimeout)
	if r.FirstTokenFactor == 0 {
		r.FirstTokenFactor = DefaultFirstTokenFactor
	}
	if r.MaxAttempts <= 0 {
		r.MaxAttempts = DefaultMaxAttempts
	}
	if r.RetryBudget == 0 {
		r.RetryBudget = DefaultRetryBudget
	}
	if r.RetryBudgetMin == 0 {
		r.RetryBudgetMin = DefaultRetryBudgetMin
	}
	return r
}

// The causes that end an upstream request early.
var (
	errFirstTokenTimeout = errors.New("no first token before the deadline")
	errIdleTimeout       = errors.New("the stream was idle past the timeout")
	errShutdown          = errors.New("kvroute is shutting down")
)

// failure is why an attempt got no answer that could go to the client:
// nothing of it was sent, so another backend may take the request.
type failure struct {
	// kind is the metrics' reason: "dial", "reset", "timeout" or "status".
	kind   string
	status int // the backend's status, for "status"
	// retryAfter is the backend's Retry-After, for a 429 or 503.
	retryAfter time.Duration
	err        error
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

// retryBudget bounds the retries pending (Envoy's retry budget): a retry
// counts from the failure that caused it until its own attempt answers
// (its first byte reaches the client) or fails. Once answered, a retried
// request loads its backend like any other. The requests in flight it is a
// share of are the most seen in the last budgetMemory: a burst whose
// healthy part has already finished still counts while its hung part
// waits for its retries.
type retryBudget struct {
	active, retrying atomic.Int64
	peak, peakAt     atomic.Int64 // the most requests in flight lately, and since when (Unix ns)
	ratio            float64
	min              int64
	now              func() time.Time
}

// budgetMemory is how long a peak of requests in flight counts.
const budgetMemory = 5 * time.Second

// start counts a request in flight.
func (b *retryBudget) start() {
	n, now := b.active.Add(1), b.now().UnixNano()
	if now-b.peakAt.Load() > int64(budgetMemory) {
		b.peak.Store(n)
		b.peakAt.Store(now)
		return
	}
	for p := b.peak.Load(); n > p && !b.peak.CompareAndSwap(p, n); p = b.peak.Load() {
	}
}

// limit is the retries pending the budget allows now.
func (b *retryBudget) limit() int64 {
	live := b.active.Load()
	if b.now().UnixNano()-b.peakAt.Load() <= int64(budgetMemory) {
		live = max(live, b.peak.Load())
	}
	return max(b.min, int64(b.ratio*float64(live)))
}

// allows reports whether one more retry fits the budget now.
func (b *retryBudget) allows() bool { return b.retrying.Load() < b.limit() }

// acquire takes a retry from the budget, if it allows one.
func (b *retryBudget) acquire() bool {
	for {
		n := b.retrying.Load()
		if n >= b.limit() {
			return false
		}
		if b.retrying.CompareAndSwap(n, n+1) {
			return true
		}
	}
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

// firstTokenDeadline is how long t's attempt may take to its first token:
// for a stream, the floor plus the factor times the predicted TTFT (or one
// at fallbackPrefillRate); for a non-streamed response, whose headers come
// with its end, the response timeout.
func (p *Proxy) firstTokenDeadline(c *call, t *router.Ticket) time.Duration {
	if !c.stream {
		return p.res.ResponseTimeout
	}
	if p.res.FirstTokenFloor < 0 {
		return -1
	}
	predicted := t.PredictedTTFT
	if predicted <= 0 && c.req != nil {
		predicted = time.Duration(float64(c.req.PromptTokens) / fallbackPrefillRate * float64(time.Second))
	}
	return p.res.FirstTokenFloor + time.Duration(p.res.FirstTokenFactor*float64(predicted))
}

// watchdog cancels an attempt when its current deadline passes: first the
// first token's, then the idle timeout's, counted from the latest read.
// A read only notes its time (touch): the timer is not reset per read, which
// would cost a lock of the runtime's timer heap per event; when it fires
// before the stream has been quiet for the whole timeout, it sets itself for
// the rest.
type watchdog struct {
	timer  *time.Timer
	cancel context.CancelCauseFunc
	// watch is what the timer guards: watchNone, watchFirst or watchIdle.
	watch atomic.Int32
	// idleFor is the idle timeout, set before watch turns watchIdle.
	idleFor time.Duration
	// base is the monotonic origin of last, the latest read's time.
	base time.Time
	last atomic.Int64
}

const (
	watchNone int32 = iota
	watchFirst
	watchIdle
)

func newWatchdog(cancel context.CancelCauseFunc) *watchdog {
	w := new(watchdog)
	w.init(cancel)
	return w
}

// init readies a zero watchdog, stopped.
func (w *watchdog) init(cancel context.CancelCauseFunc) {
	w.cancel, w.base = cancel, time.Now()
	w.timer = time.AfterFunc(time.Hour, w.fire)
	w.timer.Stop()
}

// fire runs when the timer passes.
func (w *watchdog) fire() {
	switch w.watch.Load() {
	case watchFirst:
		w.cancel(errFirstTokenTimeout)
	case watchIdle:
		quiet := time.Since(w.base) - time.Duration(w.last.Load())
		if rest := w.idleFor - quiet; rest > 0 {
			w.timer.Reset(rest)
			return
		}
		w.cancel(errIdleTimeout)
	}
}

// firstToken sets the deadline of the first token to d from now; d < 0
// turns it off.
func (w *watchdog) firstToken(d time.Duration) {
	if d < 0 {
		w.stop()
		return
	}
	w.watch.Store(watchFirst)
	w.timer.Reset(d)
}

// idle turns the watch to the idle timeout d, counted from now and then
// from every touch; d < 0 turns it off.
func (w *watchdog) idle(d time.Duration) {
	if d < 0 {
		w.stop()
		return
	}
	w.touch()
	w.idleFor = d
	w.watch.Store(watchIdle)
	w.timer.Reset(d)
}

// touch notes a read: the idle timeout counts from now.
func (w *watchdog) touch() { w.last.Store(int64(time.Since(w.base))) }

func (w *watchdog) stop() {
	w.watch.Store(watchNone)
	w.timer.Stop()
}

// idleReader notes every read that brings bytes once the first token is in,
// for the attempt's idle timeout.
type idleReader struct {
	r io.Reader
	a *attempt
}

// push pushes the body if it can be, noting every push of bytes as Read
// notes reads.
func (ir idleReader) push(s upstream.Sink) (bool, error) {
	p, ok := ir.r.(upstream.Pusher)
	if !ok {
		return false, nil
	}
	ir.a.sink = idleSink{s: s, a: ir.a} // in the attempt: boxed on its own, it would be allocated
	return p.Push(&ir.a.sink)
}

// idleSink is idleReader's sink.
type idleSink struct {
	s upstream.Sink
	a *attempt
}

func (is idleSink) Space() ([]byte, error) { return is.s.Space() }

func (is idleSink) Took(n int, more bool) error {
	if is.a.first {
		is.a.wd.touch()
	}
	return is.s.Took(n, more)
}

func (ir idleReader) Read(b []byte) (int, error) {
	n, err := ir.r.Read(b)
	if n > 0 && ir.a.first {
		ir.a.wd.touch()
	}
	return n, err
}

// heldWriter holds a response's status and headers until its first byte is
// written: until then nothing has reached the client and the request may
// still go to another backend.
type heldWriter struct {
	http.ResponseWriter
	status int
	header http.Header // copied into the response's headers when sent
	sent   bool
	// onSend, when set, has its retry of the budget given back when the
	// response is sent (the attempt has answered): the attempt itself,
	// where a closure would be an allocation a request.
	onSend *attempt
}

func (h *heldWriter) send() {
	if h.sent {
		return
	}
	h.sent = true
	if a := h.onSend; a != nil {
		a.p.retried(a.c)
	}
	dst := h.ResponseWriter.Header()
	for k, vv := range h.header {
		dst[k] = vv
	}
	h.ResponseWriter.WriteHeader(h.status)
}

func (h *heldWriter) Write(b []byte) (int, error) {
	h.send()
	return h.ResponseWriter.Write(b)
}

// FlushError flushes what was written; before anything was, there is
// nothing to flush (and the headers stay held).
func (h *heldWriter) FlushError() error {
	if !h.sent {
		return nil
	}
	// net/http's own writer flushes without the controller's allocation,
	// once per read of a stream.
	if f, ok := h.ResponseWriter.(interface{ FlushError() error }); ok {
		return f.FlushError()
	}
	return http.NewResponseController(h.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection.
func (h *heldWriter) Unwrap() http.ResponseWriter { return h.ResponseWriter }

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
