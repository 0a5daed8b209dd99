package fleetpage

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/router"
)

// DefaultDecisions is how many recent decisions the page shows: a screenful,
// enough to see the policy at work without scrolling through history.
const DefaultDecisions = 20

// maxCandidates is how many candidates' scores a decision keeps: kvroute
// explains at most 16 (the chosen one and the 15 cheapest others), so a
// slot holds them all without allocating.
const maxCandidates = 16

// Decisions keeps the last few routing decisions, each with every
// candidate's cost terms, in a ring of fixed slots: its memory is set when
// it is made, and recording a decision copies into a slot, allocating
// nothing. It is a router.Observer. Safe for concurrent use.
type Decisions struct {
	mu      sync.Mutex // guards ring and next
	ring    []decision
	next    uint64        // decisions written; the next goes to ring[next%len]
	skipped atomic.Uint64 // decisions not kept because another was being written
	now     func() time.Time
}

// decision is one slot of the ring: a decision's facts, copied out of the
// ticket (which the request goes on to use) into memory the ring owns.
type decision struct {
	at                        time.Time
	model, backend, reason    string
	prompt, maxTokens, cached int
	predicted, low, high      time.Duration
	scored                    int // len(Decision.Scores)
	n                         int // scores held: min(scored, maxCandidates)
	scores                    [maxCandidates]router.Score
}

var _ router.Observer = (*Decisions)(nil)

// NewDecisions returns a ring of the last n decisions (0 or less:
// DefaultDecisions), timed by now (nil: time.Now).
func NewDecisions(n int, now func() time.Time) *Decisions {
	if n <= 0 {
		n = DefaultDecisions
	}
	if now == nil {
		now = time.Now
	}
	return &Decisions{ring: make([]decision, n), now: now}
}

// Routed records t's decision. It is on the request's path, so it never
// waits: a decision that arrives while another is being written (or read)
// is counted as skipped instead of kept. The page shows a recent sample,
// and the request is never slowed for it.
func (d *Decisions) Routed(t *router.Ticket) {
	if !d.mu.TryLock() {
		d.skipped.Add(1)
		return
	}
	s := &d.ring[d.next%uint64(len(d.ring))]
	d.next++
	req := t.Request()
	s.at = d.now()
	s.model, s.backend, s.reason = req.Model, t.Backend.Name, t.Reason
	s.prompt, s.maxTokens, s.cached = req.PromptTokens, req.MaxTokens, t.Cached
	s.predicted, s.low, s.high = t.PredictedTTFT, t.PredictedTTFTLow, t.PredictedTTFTHigh
	s.scored = len(t.Scores)
	s.n = copy(s.scores[:], t.Scores)
	d.mu.Unlock()
}

// Skipped returns how many decisions were not kept because another was
// being written at the same moment.
func (d *Decisions) Skipped() uint64 { return d.skipped.Load() }

// Views returns the decisions held, newest first, each candidate's score in
// order of cost (cheapest first).
func (d *Decisions) Views() []DecisionView {
	d.mu.Lock()
	n := min(d.next, uint64(len(d.ring)))
	held := make([]decision, 0, n)
	for i := range n {
		held = append(held, d.ring[(d.next-1-i)%uint64(len(d.ring))])
	}
	d.mu.Unlock()
	views := make([]DecisionView, len(held))
	for i := range held {
		views[i] = held[i].view()
	}
	return views
}

// view is s as the page's JSON shows it.
func (s *decision) view() DecisionView {
	v := DecisionView{
		Time: s.at, Model: s.model, Backend: s.backend, Reason: s.reason,
		PromptTokens: s.prompt, MaxTokens: s.maxTokens, Cached: s.cached,
		PredictedTTFTMs: millis(s.predicted), PredictedLowMs: millis(s.low), PredictedHighMs: millis(s.high),
		Scored: s.scored, Candidates: make([]CandidateView, s.n),
	}
	for i, sc := range s.scores[:s.n] {
		v.Candidates[i] = CandidateView{Backend: sc.Backend, Cost: Num(sc.Cost), TTFTMs: millis(sc.TTFT), Cached: sc.Cached, Terms: sc.Terms}
	}
	slices.SortStableFunc(v.Candidates, func(a, b CandidateView) int {
		switch {
		case a.Cost < b.Cost:
			return -1
		case a.Cost > b.Cost:
			return 1
		}
		return 0
	})
	return v
}

// latestTTFT returns, by backend name, the TTFT predicted for it by the
// most recent decision that scored it: the policy's current view of each
// backend, without asking the policy.
func latestTTFT(ds []DecisionView) map[string]Num {
	out := make(map[string]Num)
	for _, d := range ds { // newest first: the first seen is the latest
		for _, c := range d.Candidates {
			if _, ok := out[c.Backend]; !ok && !c.TTFTMs.unknown() {
				out[c.Backend] = c.TTFTMs
			}
		}
		if _, ok := out[d.Backend]; !ok && !d.PredictedTTFTMs.unknown() {
			out[d.Backend] = d.PredictedTTFTMs
		}
	}
	return out
}

// millis is d in milliseconds, unknown when d is not positive (a policy
// that does not predict).
func millis(d time.Duration) Num {
	if d <= 0 {
		return unknown
	}
	return Num(float64(d) / float64(time.Millisecond))
}
