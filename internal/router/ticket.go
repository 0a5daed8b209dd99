package router

import (
	"github.com/kvroute/kvroute/internal/fleet"
)

// Ticket is one routed attempt: the policy's decision, and the request's
// load on the chosen backend, counted when it was routed. FirstToken
// releases the prefill part; Finish releases the rest, teaches the token
// estimator and hands the outcome to the policy. Call its methods from the
// request's own goroutine (or event loop).
type Ticket struct {
	// Decision is the policy's choice, with its explanation.
	Decision
	req      *Request
	tokens   *Tokens
	pins     *pins
	accuracy *accuracy
	flight   *fleet.Flight
	finished bool
}

// Request is the request the ticket routed.
func (t *Ticket) Request() *Request { return t.req }

// FirstToken marks the first token: the backend is done with the prefill.
// Calls after the first, or after Finish, do nothing.
func (t *Ticket) FirstToken() { t.flight.FirstToken() }

// Finish ends the attempt with its outcome: the backend's load is released,
// and the estimator and the policy learn from it. Calls after the first do
// nothing.
func (t *Ticket) Finish(o Outcome) {
	if t.finished {
		return
	}
	t.finished = true
	t.flight.Done()
	if o.Status == 200 && o.PromptTokens > 0 {
		t.tokens.observe(len(t.req.Prompt), o.PromptTokens)
	}
	if o.Status/100 == 2 {
		t.pins.learn(o.ResponseID, t.Backend)
	}
	t.accuracy.record(t, o)
	if t.Done != nil {
		t.Done(o)
	}
}
