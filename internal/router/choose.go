package router

import (
	"github.com/kvroute/kvroute/internal/fleet"
)

// Decide returns the decision for b with cached prompt tokens expected
// there.
func Decide(b *fleet.Backend, reason string, cached int) Decision {
	return Decision{Backend: b, Reason: reason, Cached: cached}
}

// Ties picks uniformly among the candidates that tie for best: feed it every
// candidate that ties the best so far (Reset when a better one appears) and
// it keeps each with equal probability (reservoir sampling), so that an
// idle fleet does not send everything to its first backend. A Ties is used
// by one pick, on its goroutine.
type Ties struct {
	r    *Rand
	n    int
	best int
}

// NewTies returns a Ties that draws from r.
func NewTies(r *Rand) Ties { return Ties{r: r} }

// Reset starts over with candidate i as the only best.
func (t *Ties) Reset(i int) { t.n, t.best = 1, i }

// Add counts candidate i as tying the best.
func (t *Ties) Add(i int) {
	t.n++
	if t.r.IntN(t.n) == 0 {
		t.best = i
	}
}

// Best returns the candidate kept among the ties.
func (t *Ties) Best() int { return t.best }

// LeastLoaded returns a uniformly random one of the candidates with the
// fewest requests in flight, or nil if there are none. intN(n) returns a
// uniform integer in [0, n) (a Rand's IntN). One pass, no allocation.
func LeastLoaded(cands []*fleet.Backend, intN func(int) int) *fleet.Backend {
	var best *fleet.Backend
	bestLoad, ties := int64(0), 0
	for _, b := range cands {
		n := b.Load().Requests
		switch {
		case best == nil || n < bestLoad:
			best, bestLoad, ties = b, n, 1
		case n == bestLoad:
			// Reservoir sampling: each of the tied candidates is kept with
			// equal probability.
			ties++
			if intN(ties) == 0 {
				best = b
			}
		}
	}
	return best
}
