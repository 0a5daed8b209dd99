package router

import (
	"errors"
	"math"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// ErrNoBackend means no backend can take the request; the proxy answers 503.
var ErrNoBackend = errors.New("no backend available")

// Decision is a policy's choice and its explanation.
type Decision struct {
	// Backend is the chosen backend.
	Backend *fleet.Backend
	// Reason says why, in a word: "prefix", "session", "least-cost",
	// "spill", "round-robin", "least-request", "hash", ...
	Reason string
	// Cached is how many of the request's prompt tokens the policy expects
	// the backend to have cached (0 for policies that do not know). The
	// router counts the rest as prefill queued there until the first token.
	Cached int
	// PredictedTTFT is the policy's predicted time to first token; 0 for
	// policies that do not predict.
	PredictedTTFT time.Duration
	// PredictedTTFTLow and PredictedTTFTHigh bound the TTFT's prediction
	// interval (kvroute: its 10th and 90th percentiles, as calibrated on
	// the backend's recent errors); 0 for policies that give none.
	PredictedTTFTLow, PredictedTTFTHigh time.Duration
	// PredictedITL is the policy's predicted mean time between the
	// stream's tokens there (its decode, over its tokens after the first);
	// 0 for policies that do not predict.
	PredictedITL time.Duration
	// Scores explains the choice, one entry per candidate (kvroute, among
	// more than 16: the chosen one and the 15 cheapest others); nil for
	// policies that do not score.
	Scores []Score
	// Done, when not nil, is called once with the request's outcome: a
	// learning policy keeps what it needs to learn from this pick in it, as
	// gRPC's PickResult.Done does. The Ticket calls it; it must not block.
	Done func(Outcome)
}

// Score is one candidate's evaluation by a scoring policy.
type Score struct {
	// Backend is the candidate's name.
	Backend string
	// Cost is the policy's cost; lower is better (for kvroute: seconds).
	Cost float64
	// TTFT is the predicted time to first token there; 0 if not predicted.
	TTFT time.Duration
	// Cached is the predicted cached prompt tokens there.
	Cached int
	// Terms breaks Cost into its named terms, for a policy whose cost is a
	// sum (kvroute's: queued, compute, kv_wait, slot_wait, adapter, miss, stream);
	// zero for the others, and then left out of the JSON.
	Terms Terms `json:",omitzero"`
}

// MaxTerms is how many named terms a Score can carry: kvroute's eight. Each
// more makes every decision's scores 8 bytes a candidate larger.
const MaxTerms = 8

// Terms is a cost's breakdown: Seconds[i] is the term named Names[i]. It
// is held in the Score, not behind a pointer, so that explaining a decision
// allocates nothing more; Names is a slice the policy shares among all its
// scores. Its JSON is one object, the terms by name in order
// ({"queued":0.12,"compute":0.3,...}).
type Terms struct {
	Names   []string
	Seconds [MaxTerms]float64
}

// IsZero reports whether t names no term.
func (t Terms) IsZero() bool { return len(t.Names) == 0 }

// Len returns how many terms t holds.
func (t Terms) Len() int { return min(len(t.Names), MaxTerms) }

// Sum returns the sum of t's terms, in seconds.
func (t Terms) Sum() float64 {
	var sum float64
	for _, v := range t.Seconds[:t.Len()] {
		sum += v
	}
	return sum
}

// MarshalJSON writes t as one object, its terms by name in order.
func (t Terms) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 24*t.Len()+2)
	b = append(b, '{')
	for i, name := range t.Names[:t.Len()] {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, name)
		b = append(b, ':')
		v := t.Seconds[i]
		if math.IsInf(v, 0) || math.IsNaN(v) {
			b = strconv.AppendQuote(b, strconv.FormatFloat(v, 'g', -1, 64))
			continue
		}
		b = strconv.AppendFloat(b, v, 'g', -1, 64)
	}
	return append(b, '}'), nil
}

// Policy picks a backend for a request. Implementations are safe for
// concurrent use and must not block.
type Policy interface {
	// Name is the policy's --policy value.
	Name() string
	// Pick chooses one of cands: healthy backends that serve req.Model,
	// never empty, in fleet order. req.PromptTokens is set (the Router
	// estimates it when the caller did not count it).
	Pick(req *Request, cands []*fleet.Backend) (Decision, error)
}

// FleetWatcher is implemented by policies that keep state per backend
// index. SetBackends tells them the fleet's whole new set of backends, in
// fleet order, whenever it changes (fleet.Fleet.Watch, through
// Router.SetBackends): they make room for indexes beyond those they were
// built for, before any such backend is a candidate, and forget what they
// learned about backends no longer in the set. Indexes are never reused, so
// a removed backend's requests still in flight may finish into state that
// is no longer read. SetBackends is safe for concurrent use with Pick and
// Done; it may take locks and allocate.
type FleetWatcher interface {
	SetBackends(backends []*fleet.Backend)
}

// Outcome is what happened to a routed request, as its driver (the proxy,
// the simulator) saw it.
type Outcome struct {
	// Status is the backend's HTTP status; 0 if it never answered.
	Status int
	// PromptTokens, CachedTokens and CompletionTokens come from the
	// response's usage; -1 when it had none.
	PromptTokens, CachedTokens, CompletionTokens int
	// TTFT is the time from routing to the first byte of the response body
	// (of the first token, when streaming); Latency to its end.
	TTFT, Latency time.Duration
	// Tokens is the number of streamed chunks carrying content (0 when not
	// streaming).
	Tokens int
	// ResponseID is the id of the Responses API response the backend
	// produced ("" for other requests): the Router remembers which
	// backend holds it, for the requests that continue it.
	ResponseID string
}

// Failed returns the outcome of an attempt that got no usable answer:
// the backend was not reached, or answered status (0 when it never did)
// before any of the response reached the client.
func Failed(status int) Outcome {
	return Outcome{Status: status, PromptTokens: -1, CachedTokens: -1, CompletionTokens: -1}
}
