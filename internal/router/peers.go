package router

// The policies in the peers*.go files reimplement, from their published
// descriptions, what other routers do, so that every benchmark can show
// kvroute beside them on the same fleet and workload (DESIGN §5). Each is a
// small struct, safe for concurrent use, deterministic given Options.Seed.
// None of them learns from outcomes: the peers' approximate modes learn only
// from their own routing decisions, and the router's in-flight counts already
// release a request's load when it ends.

import (
	"math"
	"sort"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/prefix"
)

// Compile-time checks that the baselines are policies.
var (
	_ Policy = (*Random)(nil)
	_ Policy = (*P2C)(nil)
	_ Policy = (*SessionBounded)(nil)
)

// Compile-time checks that the peers are policies.
var (
	_ Policy = (*SGLangCacheAware)(nil)
	_ Policy = (*DynamoKV)(nil)
	_ Policy = (*LLMDDefault)(nil)
	_ Policy = (*PrebleE2)(nil)
)

// PeerConfig tunes the policies reimplemented from other routers. Zero values
// take the defaults.
type PeerConfig struct {
	// SGLang tunes sglang-cache-aware.
	SGLang SGLangConfig
	// Dynamo tunes dynamo-kv.
	Dynamo DynamoConfig
	// LLMD tunes llmd-default.
	LLMD LLMDConfig
	// Preble tunes preble-e2.
	Preble PrebleConfig
	// DefaultKVTokens is the KV capacity assumed for a backend that reports
	// none, in tokens (default 400,000: Llama-3.1-8B on an H100).
	DefaultKVTokens int
}

const (
	// peerBlockBytes is the block size of the peers' approximate prefix
	// indexes in bytes of prompt text: about 16 tokens, the KV block of
	// vLLM and the default of Dynamo and llm-d.
	peerBlockBytes = 64
	// peerBlockTokens is that block in tokens, at DefaultRatio bytes a token.
	peerBlockTokens     = peerBlockBytes / DefaultRatio
	peerDefaultKVTokens = 400_000
)

// BaselineConfig tunes the classic balancers. Zero values take the
// defaults.
type BaselineConfig struct {
	// Epsilon is session-bounded's slack: no backend is given a request that
	// would take it above ceil((1+Epsilon) × (requests in flight + 1) /
	// candidates). Default 0.25; negative means 0.
	Epsilon float64
}

// defaultEpsilon is session-bounded's default slack.
const defaultEpsilon = 0.25

func (c PeerConfig) kvTokens() int {
	if c.DefaultKVTokens > 0 {
		return c.DefaultKVTokens
	}
	return peerDefaultKVTokens
}

// promptTokens estimates a prompt's length in tokens at DefaultRatio bytes a
// token (the peers do not tokenize either), unless the caller knows it.
func promptTokens(req *Request) int { return req.PromptTokensAt(DefaultRatio) }

// Random sends each request to a uniformly random candidate.
type Random struct {
	rand *Rand
}

// NewRandom returns the policy; seed 0 picks a random seed.
func NewRandom(seed uint64) *Random { return &Random{rand: NewRand(seed)} }

// Name implements Policy.
func (*Random) Name() string { return "random" }

// Pick implements Policy.
func (p *Random) Pick(req *Request, cands []*fleet.Backend) (Decision, error) {
	if len(cands) == 0 {
		return Decision{}, ErrNoBackend
	}
	b := cands[p.rand.IntN(len(cands))]
	return Decide(b, "random", 0), nil
}

// P2C is the power of two choices (Mitzenmacher): it draws two distinct
// candidates at random and sends the request to the one with fewer requests
// in flight (the first drawn on a tie). Decision.Scores lists the two, with
// their in-flight requests as the cost.
type P2C struct {
	rand *Rand
}

// NewP2C returns the policy; seed 0 picks a random seed.
func NewP2C(seed uint64) *P2C { return &P2C{rand: NewRand(seed)} }

// Name implements Policy.
func (*P2C) Name() string { return "p2c" }

// Pick implements Policy.
func (p *P2C) Pick(req *Request, cands []*fleet.Backend) (Decision, error) {
	switch len(cands) {
	case 0:
		return Decision{}, ErrNoBackend
	case 1:
		return Decide(cands[0], "p2c", 0), nil
	}
	i, j := p.rand.Pair(len(cands))
	li, lj := cands[i].Load(), cands[j].Load()
	if lj.Requests < li.Requests {
		i, j, li, lj = j, i, lj, li
	}
	d := Decide(cands[i], "p2c", 0)
	d.Scores = []Score{
		{Backend: cands[i].Name, Cost: float64(li.Requests)},
		{Backend: cands[j].Name, Cost: float64(lj.Requests)},
	}
	return d, nil
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
	rand    *Rand
	scratch sync.Pool // *boundedScratch
}

type boundedScratch struct {
	loads []fleet.Load
	pos   []int32 // candidate position by backend index, -1 if none
}

// NewSessionBounded builds the ring over backends, with the slack of cfg;
// seed 0 picks a random seed.
func NewSessionBounded(backends []*fleet.Backend, seed uint64, cfg BaselineConfig) *SessionBounded {
	eps := cfg.Epsilon
	switch {
	case eps == 0:
		eps = defaultEpsilon
	case eps < 0:
		eps = 0
	}
	p := &SessionBounded{ring: NewSessionHash(backends, seed), epsilon: eps, rand: NewRand(seed)}
	p.scratch.New = func() any { return new(boundedScratch) }
	return p
}

var _ FleetWatcher = (*SessionBounded)(nil)

// SetBackends implements FleetWatcher: the ring is rebuilt over backends.
func (p *SessionBounded) SetBackends(backends []*fleet.Backend) { p.ring.SetBackends(backends) }

// Name implements Policy.
func (*SessionBounded) Name() string { return "session-bounded" }

// Pick implements Policy.
func (p *SessionBounded) Pick(req *Request, cands []*fleet.Backend) (Decision, error) {
	if len(cands) == 0 {
		return Decision{}, ErrNoBackend
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
			return Decide(cands[i], reason, 0), nil
		}
		s.pos[owner] = -1 // full: skip its other points
		reason = "spill"
	}
	// No candidate is on the ring (backends added after it was built).
	b := LeastLoaded(cands, p.rand.IntN)
	return Decide(b, "least-request", 0), nil
}
