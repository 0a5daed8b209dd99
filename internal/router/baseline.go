package router

import (
	"sort"
	"strconv"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	"github.com/kvroute/kvroute/internal/fleet"
)

// Compile-time checks that the baselines are policies.
var (
	_ Policy = (*RoundRobin)(nil)
	_ Policy = (*LeastRequest)(nil)
	_ Policy = (*SessionHash)(nil)
)

// RoundRobin sends requests to the candidates in turn: what a classic L7
// balancer does by default.
type RoundRobin struct {
	next atomic.Uint64
}

// Name implements Policy.
func (*RoundRobin) Name() string { return "round-robin" }

// Pick implements Policy.
func (p *RoundRobin) Pick(_ *Request, cands []*fleet.Backend) (Decision, error) {
	if len(cands) == 0 {
		return Decision{}, ErrNoBackend
	}
	i := (p.next.Add(1) - 1) % uint64(len(cands))
	return Decision{Backend: cands[i], Reason: "round-robin"}, nil
}

// LeastRequest sends each request to the candidate with the fewest requests
// in flight (counted by the router the moment it routes), breaking ties at
// random so that an idle fleet does not send everything to its first backend.
type LeastRequest struct {
	rand *Rand
}

// NewLeastRequest returns the policy; seed 0 picks a random seed.
func NewLeastRequest(seed uint64) *LeastRequest { return &LeastRequest{rand: NewRand(seed)} }

// Name implements Policy.
func (*LeastRequest) Name() string { return "least-request" }

// Pick implements Policy.
func (p *LeastRequest) Pick(_ *Request, cands []*fleet.Backend) (Decision, error) {
	b := LeastLoaded(cands, p.rand.IntN)
	if b == nil {
		return Decision{}, ErrNoBackend
	}
	return Decision{Backend: b, Reason: "least-request"}, nil
}

// SessionHash maps each session key onto a consistent-hash ring of the
// backends, the way nginx's `hash $key consistent` (ketama) and HAProxy's
// `balance hdr()` with consistent hashing do: a session stays on one backend,
// and when backends come or go only the sessions of those move. Requests
// without a session key go to a random candidate.
type SessionHash struct {
	rand *Rand
	// ring is over every backend of the fleet, rebuilt when the fleet
	// changes (SetBackends).
	ring atomic.Pointer[hashRing]
}

// hashRing is a consistent-hash ring: points sorted by hash, each naming a
// backend index.
type hashRing struct {
	points []uint64
	owners []int
}

var _ FleetWatcher = (*SessionHash)(nil)

// ringPoints is the number of points per backend, as in ketama (160).
const ringPoints = 160

// NewSessionHash builds the ring over backends; seed 0 picks a random seed
// for requests without a key.
func NewSessionHash(backends []*fleet.Backend, seed uint64) *SessionHash {
	p := &SessionHash{rand: NewRand(seed)}
	p.SetBackends(backends)
	return p
}

// SetBackends implements FleetWatcher: the ring is rebuilt over backends.
// A backend's points depend on its name only, so only the sessions of the
// backends that came or went move.
func (p *SessionHash) SetBackends(backends []*fleet.Backend) {
	type point struct {
		h     uint64
		owner int
	}
	pts := make([]point, 0, len(backends)*ringPoints)
	for _, b := range backends {
		for i := range ringPoints {
			pts = append(pts, point{xxhash.Sum64String(b.Name + "-" + strconv.Itoa(i)), b.Index})
		}
	}
	sort.Slice(pts, func(i, j int) bool { return pts[i].h < pts[j].h })
	r := &hashRing{}
	for _, pt := range pts {
		r.points = append(r.points, pt.h)
		r.owners = append(r.owners, pt.owner)
	}
	p.ring.Store(r)
}

// Name implements Policy.
func (*SessionHash) Name() string { return "session-hash" }

// Pick implements Policy.
func (p *SessionHash) Pick(req *Request, cands []*fleet.Backend) (Decision, error) {
	if len(cands) == 0 {
		return Decision{}, ErrNoBackend
	}
	if req.SessionKey == "" {
		return Decision{Backend: cands[p.rand.IntN(len(cands))], Reason: "random"}, nil
	}
	h := xxhash.Sum64String(req.SessionKey)
	if b := p.owner(h, cands); b != nil {
		return Decision{Backend: b, Reason: "hash"}, nil
	}
	// None of the candidates is on the ring: the fleet shrank between the
	// caller's choice of candidates and this pick. They are still
	// routable; hash over them rather than fail the request.
	return Decision{Backend: cands[h%uint64(len(cands))], Reason: "hash"}, nil
}

// owner walks the ring clockwise from h to the first point whose backend is
// a candidate.
func (p *SessionHash) owner(h uint64, cands []*fleet.Backend) *fleet.Backend {
	r := p.ring.Load()
	if len(r.points) == 0 {
		return nil
	}
	start := sort.Search(len(r.points), func(i int) bool { return r.points[i] >= h })
	for k := range r.points {
		owner := r.owners[(start+k)%len(r.points)]
		// Candidates are few relative to ring points and in fleet order;
		// a linear scan beats building a set on every pick.
		for _, b := range cands {
			if b.Index == owner {
				return b
			}
		}
	}
	return nil
}
