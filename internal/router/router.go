// Package router decides which backend serves a request. A policy is a small
// struct behind the Policy interface; the proxy asks it to pick among the
// healthy backends that serve the request's model, counts the request on the
// chosen backend, and reports the outcome back to policies that learn.
package router

import (
	"errors"
	"slices"

	"github.com/kvroute/kvroute/internal/fleet"
)

// ErrNoChoice means a policy returned no backend and no error: a bug in the
// policy, which the proxy answers with 500.
var ErrNoChoice = errors.New("the policy chose no backend")

// Router drives one policy for one router front (the proxy, a simulated
// replica, the ext_proc picker): it estimates a request's tokens once for
// every policy, asks the policy to pick, counts the request's load on the
// chosen backend at once and hands back the Ticket that releases it. Safe for
// concurrent use.
type Router struct {
	policy Policy
	tokens *Tokens
	pins   *pins // nil: no response pinning (pins.go)
	// accuracy scores the policy's predictions (accuracy.go).
	accuracy *accuracy
	// observer, when not nil, is told of every ticket (observer.go).
	observer Observer
}

// NewRouter returns a Router for policy, estimating prompt lengths with
// tokens (nil: a fresh estimator).
func NewRouter(policy Policy, tokens *Tokens) *Router {
	if tokens == nil {
		tokens = NewTokens()
	}
	return &Router{policy: policy, tokens: tokens, accuracy: newAccuracy()}
}

// NewPinningRouter is NewRouter for a Router that also remembers the
// backend of up to responsePins Responses API responses, to send the
// requests that continue them there (0: DefaultResponsePins; negative:
// none).
func NewPinningRouter(policy Policy, tokens *Tokens, responsePins int) *Router {
	r := NewRouter(policy, tokens)
	r.pins = newPins(responsePins)
	return r
}

// Name is the policy's name.
func (r *Router) Name() string { return r.policy.Name() }

// Policy returns the policy the router drives.
func (r *Router) Policy() Policy { return r.policy }

// SetBackends tells the policy the fleet's new set of backends, if it keeps
// state per backend (FleetWatcher); other policies need nothing. It is the
// fleet's watcher (fleet.Fleet.Watch). Safe for concurrent use with Route.
func (r *Router) SetBackends(backends []*fleet.Backend) {
	r.accuracy.setBackends(backends)
	if w, ok := r.policy.(FleetWatcher); ok {
		w.SetBackends(backends)
	}
}

// Route picks a backend for req among cands (healthy backends that serve
// req.Model, in fleet order), counts the request there and returns its
// ticket. The caller must Finish the ticket exactly once, whatever happens;
// to try another backend after a failed attempt it finishes this ticket
// with the failure and routes again without the failed backend (Without).
// The errors are ErrNoBackend and ErrNoChoice, or the policy's own.
func (r *Router) Route(req *Request, cands []*fleet.Backend) (*Ticket, error) {
	r.Estimate(req)
	setAdapter(req, cands)
	// A response continued goes back to the backend that stores it; the
	// policy still picks (among that one), so that it counts and learns
	// the request as any other.
	cands, pinned := r.pins.narrow(req.PreviousResponseID, cands)
	d, err := r.policy.Pick(req, cands)
	if err != nil {
		return nil, err
	}
	if d.Backend == nil {
		return nil, ErrNoChoice
	}
	if pinned {
		d.Reason = ReasonResponse
	}
	prompt := req.PromptTokens
	cached := min(max(d.Cached, 0), prompt)
	t := &Ticket{Decision: d, req: req, tokens: r.tokens, pins: r.pins, accuracy: r.accuracy}
	t.flight = d.Backend.Start(prompt-cached, prompt+req.MaxTokens)
	if r.observer != nil {
		r.observer.Routed(t) // t is on the heap already: telling costs no allocation
	}
	return t, nil
}

// Estimate sets req.PromptTokens to the router's estimate unless the caller
// counted it, as Route does; for callers that need the number before
// routing (admission, rate limits).
func (r *Router) Estimate(req *Request) {
	if req.PromptTokens <= 0 {
		req.PromptTokens = r.tokens.Estimate(req.Prompt)
	}
}

// Without returns cands without b, reusing cands' array.
func Without(cands []*fleet.Backend, b *fleet.Backend) []*fleet.Backend {
	return slices.DeleteFunc(cands, func(x *fleet.Backend) bool { return x == b })
}
