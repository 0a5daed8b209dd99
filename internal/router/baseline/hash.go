package baseline

import (
	"math"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/router"
)

// Config tunes the classic balancers. Zero values take the
// defaults.
type Config struct {
	// Epsilon is session-bounded's slack: no backend is given a request that
	// would take it above ceil((1+Epsilon) × (requests in flight + 1) /
	// candidates). Default 0.25; negative means 0.
	Epsilon float64
}

// defaultEpsilon is session-bounded's default slack.
const defaultEpsilon = 0.25

// SessionHash maps each session key onto a consistent-hash ring of the
// backends, the way nginx's `hash $key consistent` (ketama) and HAProxy's
// `balance hdr()` with consistent hashing do: a session stays on one backend,
// and when backends come or go only the sessions of those move. Requests
// without a session key go to a random candidate.
type SessionHash struct {
	rand *router.Rand
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

var _ router.FleetWatcher = (*SessionHash)(nil)

// ringPoints is the number of points per backend, as in ketama (160).
const ringPoints = 160

// NewSessionHash builds the ring over backends; seed 0 picks a random seed
// for requests without a key.
func NewSessionHash(backends []*fleet.Backend, seed uint64) *SessionHash {
	p := &SessionHash{rand: router.NewRand(seed)}
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
func (p *SessionHash) Pick(req *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	if len(cands) == 0 {
		return router.Decision{}, router.ErrNoBackend
	}
	if req.SessionKey == "" {
		return router.Decision{Backend: cands[p.rand.IntN(len(cands))], Reason: "random"}, nil
	}
	h := xxhash.Sum64String(req.SessionKey)
	if b := p.owner(h, cands); b != nil {
		return router.Decision{Backend: b, Reason: "hash"}, nil
	}
	// None of the candidates is on the ring: the fleet shrank between the
	// caller's choice of candidates and this pick. They are still
	// routable; hash over them rather than fail the request.
	return router.Decision{Backend: cands[h%uint64(len(cands))], Reason: "hash"}, nil
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

// SessionBounded is consistent hashing with bounded loads (Mirrokni, Thorup
// and Zadimoghaddam, 2018). The session key is hashed onto the ring of
// SessionHash (160 points per backend); walking clockwise, the request goes
// to the first candidate whose live in-flight requests + 1 ≤ ceil((1+ε) ×
// (total in flight + 1) / candidates), so no backend exceeds (1+ε) times the
// mean and the next backend on the ring takes the overflow. A request
// without a session key is hashed by the first block (256 bytes) of its
// prompt instead, so prompts that share their beginning, typically the
// system prompt, share a backend as far as the bound allows. Reasons:
// "session" or "hash" (the key's own backend took it), "spill" (a later one
// on the ring did).
type SessionBounded struct {
	ring    *SessionHash
	epsilon float64
	rand    *router.Rand
	scratch sync.Pool // *boundedScratch
}

type boundedScratch struct {
	loads []fleet.Load
	pos   []int32 // candidate position by backend index, -1 if none
}

// NewSessionBounded builds the ring over backends, with the slack of cfg;
// seed 0 picks a random seed.
func NewSessionBounded(backends []*fleet.Backend, seed uint64, cfg Config) *SessionBounded {
	eps := cfg.Epsilon
	switch {
	case eps == 0:
		eps = defaultEpsilon
	case eps < 0:
		eps = 0
	}
	p := &SessionBounded{ring: NewSessionHash(backends, seed), epsilon: eps, rand: router.NewRand(seed)}
	p.scratch.New = func() any { return new(boundedScratch) }
	return p
}

var _ router.FleetWatcher = (*SessionBounded)(nil)

// SetBackends implements FleetWatcher: the ring is rebuilt over backends.
func (p *SessionBounded) SetBackends(backends []*fleet.Backend) { p.ring.SetBackends(backends) }

// Name implements Policy.
func (*SessionBounded) Name() string { return "session-bounded" }

// Pick implements Policy.
func (p *SessionBounded) Pick(req *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	if len(cands) == 0 {
		return router.Decision{}, router.ErrNoBackend
	}
	s := p.scratch.Get().(*boundedScratch)
	defer p.scratch.Put(s)
	s.loads = s.loads[:0]
	var total int64
	top := 0
	for _, b := range cands {
		l := b.Load()
		s.loads = append(s.loads, l)
		total += l.Requests
		top = max(top, b.Index+1)
	}
	// The tolerance keeps a product that is an integer in exact arithmetic
	// from rounding up to the next one.
	bound := int64(math.Ceil((1+p.epsilon)*float64(total+1)/float64(len(cands)) - 1e-9))
	if cap(s.pos) < top {
		s.pos = make([]int32, top)
	}
	s.pos = s.pos[:top]
	for i := range s.pos {
		s.pos[i] = -1
	}
	for i, b := range cands {
		if b.Index >= 0 {
			s.pos[b.Index] = int32(i)
		}
	}

	key, reason := req.SessionKey, "session"
	if key == "" {
		key, reason = req.Prompt[:min(len(req.Prompt), prefix.DefaultBlockBytes)], "hash"
	}
	h := xxhash.Sum64String(key)
	r := p.ring.ring.Load()
	points, owners := r.points, r.owners
	start := sort.Search(len(points), func(i int) bool { return points[i] >= h })
	for k := range points {
		owner := owners[(start+k)%len(points)]
		if owner >= len(s.pos) || s.pos[owner] < 0 {
			continue
		}
		i := s.pos[owner]
		if s.loads[i].Requests+1 <= bound {
			return router.Decide(cands[i], reason, 0), nil
		}
		s.pos[owner] = -1 // full: skip its other points
		reason = "spill"
	}
	// No candidate is on the ring (backends added after it was built).
	b := router.LeastLoaded(cands, p.rand.IntN)
	return router.Decide(b, "least-request", 0), nil
}
