// Package baseline holds the classic balancers kvroute is measured against:
// round-robin, least-request, random, power of two choices, and consistent
// hashing of the session key, plain and with bounded loads. They know
// nothing of prompts or caches: what an L7 balancer in front of a fleet
// does by default.
package baseline

import (
	"sync/atomic"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// Compile-time checks that the baselines are policies.
var (
	_ router.Policy = (*Random)(nil)
	_ router.Policy = (*P2C)(nil)
	_ router.Policy = (*SessionBounded)(nil)
	_ router.Policy = (*RoundRobin)(nil)
	_ router.Policy = (*LeastRequest)(nil)
	_ router.Policy = (*SessionHash)(nil)
)

// RoundRobin sends requests to the candidates in turn: what a classic L7
// balancer does by default.
type RoundRobin struct {
	next atomic.Uint64
}

// Name implements Policy.
func (*RoundRobin) Name() string { return "round-robin" }

// Pick implements Policy.
func (p *RoundRobin) Pick(_ *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	if len(cands) == 0 {
		return router.Decision{}, router.ErrNoBackend
	}
	i := (p.next.Add(1) - 1) % uint64(len(cands))
	return router.Decision{Backend: cands[i], Reason: "round-robin"}, nil
}

// LeastRequest sends each request to the candidate with the fewest requests
// in flight (counted by the router the moment it routes), breaking ties at
// random so that an idle fleet does not send everything to its first backend.
type LeastRequest struct {
	intN func(int) int
}

// NewLeastRequest returns the policy; seed 0 picks a random seed.
func NewLeastRequest(seed uint64) *LeastRequest {
	return &LeastRequest{intN: router.NewRand(seed).IntN}
}

// NewLeastRequestRand returns the policy breaking ties with intN, which
// returns a uniform random int in [0, n) and must be safe for concurrent
// use (math/rand/v2.IntN is): for a caller that owns its random source, as
// the proxy does for tests that fix the tie-breaks.
func NewLeastRequestRand(intN func(int) int) *LeastRequest {
	return &LeastRequest{intN: intN}
}

// Name implements Policy.
func (*LeastRequest) Name() string { return "least-request" }

// Pick implements Policy.
func (p *LeastRequest) Pick(_ *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	b := router.LeastLoaded(cands, p.intN)
	if b == nil {
		return router.Decision{}, router.ErrNoBackend
	}
	return router.Decision{Backend: b, Reason: "least-request"}, nil
}

// Random sends each request to a uniformly random candidate.
type Random struct {
	rand *router.Rand
}

// NewRandom returns the policy; seed 0 picks a random seed.
func NewRandom(seed uint64) *Random { return &Random{rand: router.NewRand(seed)} }

// Name implements Policy.
func (*Random) Name() string { return "random" }

// Pick implements Policy.
func (p *Random) Pick(req *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	if len(cands) == 0 {
		return router.Decision{}, router.ErrNoBackend
	}
	b := cands[p.rand.IntN(len(cands))]
	return router.Decide(b, "random", 0), nil
}

// P2C is the power of two choices (Mitzenmacher): it draws two distinct
// candidates at random and sends the request to the one with fewer requests
// in flight (the first drawn on a tie). Decision.Scores lists the two, with
// their in-flight requests as the cost.
type P2C struct {
	rand *router.Rand
}

// NewP2C returns the policy; seed 0 picks a random seed.
func NewP2C(seed uint64) *P2C { return &P2C{rand: router.NewRand(seed)} }

// Name implements Policy.
func (*P2C) Name() string { return "p2c" }

// Pick implements Policy.
func (p *P2C) Pick(req *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	switch len(cands) {
	case 0:
		return router.Decision{}, router.ErrNoBackend
	case 1:
		return router.Decide(cands[0], "p2c", 0), nil
	}
	i, j := p.rand.Pair(len(cands))
	li, lj := cands[i].Load(), cands[j].Load()
	if lj.Requests < li.Requests {
		i, j, li, lj = j, i, lj, li
	}
	d := router.Decide(cands[i], "p2c", 0)
	d.Scores = []router.Score{
		{Backend: cands[i].Name, Cost: float64(li.Requests)},
		{Backend: cands[j].Name, Cost: float64(lj.Requests)},
	}
	return d, nil
}
