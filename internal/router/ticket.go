package router

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"

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
}

// NewRouter returns a Router for policy, estimating prompt lengths with
// tokens (nil: a fresh estimator).
func NewRouter(policy Policy, tokens *Tokens) *Router {
	if tokens == nil {
		tokens = NewTokens()
	}
	return &Router{policy: policy, tokens: tokens}
}

// Name is the policy's name.
func (r *Router) Name() string { return r.policy.Name() }

// Policy returns the policy the router drives.
func (r *Router) Policy() Policy { return r.policy }

// SetBackends tells the policy the fleet's new set of backends, if it keeps
// state per backend (FleetWatcher); other policies need nothing. It is the
// fleet's watcher (fleet.Fleet.Watch). Safe for concurrent use with Route.
func (r *Router) SetBackends(backends []*fleet.Backend) {
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
	t := &Ticket{Decision: d, req: req, tokens: r.tokens, pins: r.pins}
	t.flight = d.Backend.Start(prompt-cached, prompt+req.MaxTokens)
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
	if t.Done != nil {
		t.Done(o)
	}
}

// Tokens estimates a prompt's length in tokens from its bytes, at a ratio
// learned from the prompt lengths backends report: decayed sums of bytes and
// tokens, so that long prompts, whose estimate matters, weigh most (short
// ones carry the chat template's fixed tokens). Safe for concurrent use.
type Tokens struct {
	// ratio is the bytes per token (float64 bits), read by every request
	// without the lock that guards the sums it is learned from.
	ratio          atomic.Uint64
	mu             sync.Mutex
	bytes, counted float64
}

// Until observations say otherwise, a token is defaultRatio bytes (English
// text in a Llama-3 tokenizer), as if priorTokens tokens had been seen. The
// prefix indexes size their blocks of prompt text at defaultRatio too, so
// that a block of text stands for a fixed number of engine tokens.
const (
	defaultRatio = 4.0
	priorTokens  = 1000.0
	ratioDecay   = 1 - 1.0/64
)

// NewTokens returns an estimator at the prior ratio.
func NewTokens() *Tokens {
	t := &Tokens{bytes: defaultRatio * priorTokens, counted: priorTokens}
	t.ratio.Store(math.Float64bits(defaultRatio))
	return t
}

// Ratio returns the learned bytes of prompt text per token.
func (t *Tokens) Ratio() float64 { return math.Float64frombits(t.ratio.Load()) }

// Estimate returns the tokens of a prompt of len(prompt) bytes.
func (t *Tokens) Estimate(prompt string) int {
	return int(math.Ceil(float64(len(prompt)) / t.Ratio()))
}

// observe learns from a prompt of n bytes that the backend counted as
// tokens tokens; prompts given without text teach nothing.
func (t *Tokens) observe(n, tokens int) {
	if n == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.bytes = t.bytes*ratioDecay + float64(n)
	t.counted = t.counted*ratioDecay + float64(tokens)
	t.ratio.Store(math.Float64bits(t.bytes / t.counted))
}

// Spec is one policy in the registry: its --policy name, a line for --help,
// and its constructor for a fleet of backends (their Index fields number
// them 0..len-1; nil when only validating the name).
type Spec struct {
	Name string
	Doc  string
	New  func(backends []*fleet.Backend, opts Options) Policy
}

// New returns a Router driving the policy called name for a fleet of
// backends.
func New(name string, backends []*fleet.Backend, opts Options) (*Router, error) {
	name, err := withObjective(name, &opts)
	if err != nil {
		return nil, err
	}
	for _, s := range registry {
		if s.Name == name {
			if opts.Tokens == nil {
				opts.Tokens = NewTokens()
			}
			r := NewRouter(s.New(backends, opts), opts.Tokens)
			r.pins = newPins(opts.ResponsePins)
			return r, nil
		}
	}
	return nil, fmt.Errorf("unknown policy %q (have %s)", name, names())
}

// Names lists the policies New knows, the default first.
func Names() []string {
	out := make([]string, len(registry))
	for i, s := range registry {
		out[i] = s.Name
	}
	return out
}

// Specs lists the registry: every policy with its one-line description.
func Specs() []Spec { return slices.Clone(registry) }
