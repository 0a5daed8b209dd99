package proxy

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/auth"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/router"
)

// Overload configures what the proxy does when the fleet is full. Zero
// values take the defaults.
type Overload struct {
	// Admission configures the router's queue (caps, queue length and
	// timeout); see the admission package.
	Admission admission.Config
	// MaxPerBackend is the most generation requests in flight on one
	// backend (default admission.DefaultMaxPerBackend; negative: no cap). Past it a
	// backend is not a candidate, and when every candidate is full the
	// request waits in the router's queue, where it can still go to
	// whichever backend frees first, rather than in one engine's queue.
	MaxPerBackend int
	// DefaultDeadline is the time to first token granted a request that
	// sets no X-Kvroute-Deadline; 0 means none.
	DefaultDeadline time.Duration
}

// Request headers of admission.
const (
	// HeaderDeadline is how long the client grants the request to its
	// first token: a Go duration ("2s") or seconds ("2.5"). A request the
	// best backend is predicted to miss it on is refused at once (429,
	// deadline_unmeetable) instead of spending prefill that would be thrown
	// away.
	HeaderDeadline = "X-Kvroute-Deadline"
)

// entry describes r's generation request g for admission: its class from
// the X-Kvroute-Priority header and its key (a header may lower the key's
// class, never raise it), its tenant (the X-Kvroute-Tenant header, else the
// key's name), its tokens and its deadline.
func (p *Proxy) entry(r *http.Request, req *router.Request) (admission.Entry, *apiError) {
	class, err := admission.ParseClass(r.Header.Get(admission.HeaderPriority))
	if err != nil {
		return admission.Entry{}, openai.BadRequest("", "header %s: %v", admission.HeaderPriority, err)
	}
	tenant := r.Header.Get(admission.HeaderTenant)
	if key, ok := auth.KeyFromContext(r.Context()); ok {
		keyClass := admission.Standard
		switch {
		case key.Priority > 0:
			keyClass = admission.Critical
		case key.Priority < 0:
			keyClass = admission.Sheddable
		}
		if r.Header.Get(admission.HeaderPriority) == "" || class < keyClass {
			class = keyClass
		}
		tenant = key.Name // a key's holder cannot pose as another tenant
	}
	deadline := p.over.DefaultDeadline
	if s := r.Header.Get(HeaderDeadline); s != "" {
		d, err := parseDeadline(s)
		if err != nil {
			return admission.Entry{}, openai.BadRequest("", "header %s: %v", HeaderDeadline, err)
		}
		deadline = d
	}
	return admission.Entry{Class: class, Tenant: tenant, Deadline: deadline,
		Tokens: int64(req.PromptTokens + max(req.MaxTokens, 0))}, nil
}

// parseDeadline reads a deadline as a Go duration or in seconds.
func parseDeadline(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return d, nil
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && f > 0 && f < 1e6 {
		return time.Duration(f * float64(time.Second)), nil
	}
	return 0, errors.New("want a positive duration, such as 2s or 2.5")
}

// admitGeneration waits until the request described by e may run on one of cands,
// and returns the candidates with room and the release of its slot; or it
// has answered the client (429 with Retry-After, or the client left).
func (p *Proxy) admitGeneration(w http.ResponseWriter, r *http.Request, e admission.Entry, cands []*fleet.Backend, model string) ([]*fleet.Backend, func(), bool) {
	release, err := p.queue.Acquire(r.Context(), e, func() bool { return p.roomOn(cands) })
	if err != nil {
		if rej, ok := errors.AsType[*admission.Rejection](err); ok {
			p.log.Info("request refused", "reason", rej.Err, "class", e.Class, "tenant", e.Tenant, "retry_after", rej.RetryAfter)
			w.Header().Set("Retry-After", strconv.Itoa(rej.RetryAfterSeconds()))
			p.rejectFor(w, rej.OpenAI(), model)
			return nil, nil, false
		}
		// The client went away while queued.
		p.metrics.requests.WithLabelValues(noBackend, statusClientClosed, noBackend, p.modelLabel(model)).Inc()
		return nil, nil, false
	}
	if !slices.ContainsFunc(cands, func(b *fleet.Backend) bool { return !p.hasRoom(b) }) {
		return cands, release, true // as nearly always: no copy to make
	}
	room := cands[:0:0]
	for _, b := range cands {
		if p.hasRoom(b) {
			room = append(room, b)
		}
	}
	if len(room) == 0 {
		room = cands // counts moved since canRun: the policy's bound decides
	}
	return room, release, true
}

// hasRoom reports whether b is below the per-backend cap.
func (p *Proxy) hasRoom(b *fleet.Backend) bool {
	return p.over.MaxPerBackend < 0 || b.Load().Requests < int64(p.over.MaxPerBackend)
}

// roomOn reports whether some candidate is below the per-backend cap.
func (p *Proxy) roomOn(cands []*fleet.Backend) bool {
	for _, b := range cands {
		if p.hasRoom(b) {
			return true
		}
	}
	return false
}

// missesDeadline reports whether the policy predicts t's request to miss its
// deadline even on the backend it chose; if so it refuses the request (429,
// deadline_unmeetable) and ends the ticket.
func (p *Proxy) missesDeadline(w http.ResponseWriter, t *router.Ticket, deadline time.Duration) bool {
	if deadline <= 0 || t.PredictedTTFT <= deadline {
		return false
	}
	t.Finish(router.Failed(0)) // never sent: the policy takes back its prediction
	rej := &admission.Rejection{Err: admission.ErrDeadline, RetryAfter: admission.MinRetryAfter}
	e := rej.OpenAI()
	e.Message = "the request's deadline of " + deadline.String() + " cannot be met: the best backend's predicted time to first token is " +
		t.PredictedTTFT.Round(time.Millisecond).String()
	p.metrics.deadline.Inc()
	w.Header().Set("Retry-After", strconv.Itoa(rej.RetryAfterSeconds()))
	p.rejectFor(w, e, t.Request().Model)
	return true
}

// waitRetry is the Retry-After of a 503 for want of a healthy backend: a
// health check's round.
const waitRetry = "1"

// backoffFor is how long a backend that answered 429 without a Retry-After
// is avoided.
const backoffFor = time.Second
