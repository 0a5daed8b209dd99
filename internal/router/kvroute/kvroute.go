// Package kvroute is kvroute's own routing policy: it predicts every
// candidate's time to first token from the prefix it holds, the prefill
// queued there and the KV room left, prices the request's stream and its
// delay to the streams already there, and picks the cheapest.
package kvroute

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/router"
)

var _ router.Policy = (*Policy)(nil)

// Policy is kvroute's own policy. For every candidate it predicts the
// request's time to first token there,
//
//	TTFT(b) = overhead(b) + (queued prefill tokens on b + the request's uncached tokens on b) / prefill rate(b)
//	          + requests decoding on b × slowdown per decoding request(b)
//	          + KV wait(b),
//
// where the queued prefill and the decoding requests are the router's own
// exact, immediate counts of the work it sent, the uncached tokens come from
// the prefix index (plus a learned share of what a longer memory of the
// backend's recent prompts holds), overhead, rate and slowdown are learned from observed
// TTFTs over the whole fleet and scaled per backend by how much slower or
// faster its own TTFTs have been than that fit predicted, and the KV wait is
// the time until b's cache has room for the request: the tokens b's requests
// hold plus the request's own beyond b's KV capacity, freed at about one
// cache's worth per mean request lifetime (also learned).
//
// To that it adds the uncached prefill once more, times MissPenalty: the
// price the rest of the fleet pays for a recomputed prefix. Under the
// default objective (ObjectiveE2E) it adds the request's own stream there
// and the delay it adds to the streams in flight there (decode.go):
//
//	cost(b) = TTFT(b) + penalty × prefill(b) + tokens × per token(b) + others(b).
//
// It picks the lowest cost; among near-ties (within 10 % or 5 ms) the session's backend,
// else the one expected to hold most of the prompt, else at random. A conversation or a hot prefix therefore stays where
// its cache is until the queue there costs more than prefilling elsewhere;
// then it spills to the next cheapest backend, and the index remembers both,
// so the prefix spreads to as few backends as the load needs. No backend may
// take more than LoadFactor times the mean in-flight requests (plus four).
type Policy struct {
	cfg  Config
	rand *router.Rand
	// index is two tiers over one table of blocks: tier 0 what each
	// backend holds, as an LRU of the prompts routed there bounded by its
	// KV capacity; tier 1 (recent) remembers recentFactor times as many
	// blocks per backend: what it probably holds and what it held until
	// lately. An engine's cache is not the index's LRU of routed prompts
	// (it keeps a request's blocks from when it finishes, keeps what
	// running requests hold, evicts sooner when requests wait for memory),
	// so a prefix the index has just forgotten is often still there; and
	// where it is not, recomputing it there costs no more than anywhere
	// else. Forgetting it outright moved conversations off the backend that
	// still held them. One table for both: each block is looked up once per
	// request, which at a thousand backends is a third of a decision's time.
	index *prefix.Index

	// learner owns what outcomes teach; Pick reads its latest snapshot
	// without a lock (learn.go).
	learner learner
	// outputs learns how long requests' streams are (output.go).
	outputs *outputs
	// cal calibrates the TTFT to the engines as they behave, and watches
	// the cache signal (calibrate.go).
	cal calibration
	// members is the fleet's backends as SetBackends last told them, for
	// the metrics.
	members atomic.Pointer[[]*fleet.Backend]
	// mu guards what every pick reads and changes: sessions, the queue
	// model and the arrival rate.
	mu       sync.Mutex
	sessions map[string]int
	// queue is each backend's prefill work ahead of a new request, by
	// backend index (see drain).
	queue []drain
	// shares is each backend's recent prefill, by backend index, which
	// slows its streams (decode.go).
	shares []share
	// epoch is when the policy was made: queue times are seconds since it,
	// cheaper to subtract for a thousand backends than time.Time.
	epoch time.Time
	// arrivals counts the requests routed, decayed over arrivalWindow
	// seconds, as of arrivedAt.
	arrivals  float64
	arrivedAt time.Time

	// prune keeps the backends ordered by load for pruned picks.
	prune pruner
	// returns learns whether sessions come back (replicas.go).
	returns returning

	scratch sync.Pool // *pickScratch
	// width is how many backend indexes the per-backend state has room
	// for (SetBackends grows it); scratch taken from the pool is resized
	// to it.
	width atomic.Int64
	// burst tells a replica behind pushed counts that it is in a burst
	// (replicas.go).
	burst burstWatch
	// lanePos is each backend's place in the order lanes split (inLane).
	lanePos atomic.Pointer[[]int32]
	// adapters is what the router sent of each LoRA adapter (lora.go).
	adapters adapters
}

var _ router.FleetWatcher = (*Policy)(nil)

// Config tunes the kvroute policy. Zero values take the defaults.
type Config struct {
	// BlockBytes is the prefix index's block size in bytes of prompt text
	// (default prefix.DefaultBlockBytes).
	BlockBytes int
	// LoadFactor bounds every backend's in-flight requests to LoadFactor ×
	// the mean + 4 (default 2).
	LoadFactor float64
	// DefaultKVTokens is the KV capacity assumed for a backend that does not
	// report one (default 400,000 tokens: Llama-3.1-8B on an H100).
	DefaultKVTokens int
	// MissPenalty weighs the prefill a request would cause on a backend
	// without its prefix, on top of the wait it adds to the request itself:
	// recomputing a cached prefix also delays everyone queued behind it and
	// spends cache space on a second copy. Default 1; negative means 0.
	MissPenalty float64
	// Seed seeds the tie-breaks; 0 picks a random seed.
	Seed uint64
	// Now is the clock that drains the queued prefill estimate; nil means
	// time.Now. The simulator passes its virtual clock.
	Now func() time.Time
	// Metrics returns a backend's fresh scraped metrics or nil (see
	// policies.Options.Metrics); kvroute reads how many requests an engine runs at
	// once where it says (llama.cpp's slots). Nil means none.
	Metrics func(*fleet.Backend) *fleet.Metrics
	// Replicas is the number of router replicas sharing the fleet behind a
	// random split (default 1); with more, each scales its counts of the
	// load and places sessions it does not know by consistent hashing (see
	// replicas.go).
	Replicas int
	// PeersExact tells a replica that the other replicas' counts reach it
	// before every pick (the simulator's --gossip-each-request; no poll
	// does): with the engines' KV events as well it then decides as one
	// router (see asOne).
	PeersExact bool
	// PeerPush tells a replica that the other replicas' counts are pushed
	// to it as they change and reach it within PeerPush (kvroute serve's
	// --peer-push, the simulator's --gossip-push): with the engines' KV
	// events it then decides as one router, but in a burst (see asOne).
	PeerPush time.Duration
	// PeersPushed reports whether every other replica's counts come by
	// push now, none by a poll (a peer too old to stream is polled); nil
	// means they do whenever PeerPush is set.
	PeersPushed func() bool
	// PeerMaxAge is how old the other replicas' reported load may be and
	// still count (default DefaultPeerMaxAge); past it, the replica scales
	// its own counts instead.
	PeerMaxAge time.Duration
	// Tokens estimates prompt lengths (the Router's, shared); nil means a
	// fresh estimator.
	Tokens *router.Tokens
	// Events, when not nil, tells what backends hold from their engines'
	// KV events: their counts replace the index's guess where they are
	// exact (router.KVEvents). Nil: the index alone, as without events.
	Events router.KVEvents
	// Objective is what the policy minimises (default ObjectiveE2E; see
	// decode.go). SLO is the joint objective ObjectiveGoodput
	// serves.
	Objective Objective
	SLO       SLO
	// FullScan scores every candidate on every pick, as kvroute did
	// before it pruned (prune.go): the pick's cost then grows with
	// the fleet. PruneLeast and PruneHolders size the pruned set: the
	// least loaded candidates and the deepest prefix holders it scores
	// (defaults 16 and 16); fleets of up to twice their sum are scanned
	// whole.
	FullScan                 bool
	PruneLeast, PruneHolders int
	// Lanes names this replica and the other replicas it hears from now,
	// for the lanes a burst behind pushed counts is split by (see inLane;
	// kvroute serve's peers.Poller.Replicas); nil: no lanes.
	Lanes func() (self string, others []string)
	// NoScores leaves Decision.Scores empty: the simulator, which reads
	// no explanation, then does not build one for each of a million picks.
	NoScores bool
	// NoCalibration prices and predicts with the engine model's TTFT as it
	// is, never as calibrated to what the engines' first tokens took, even
	// where the calibrated TTFT predicts better (calibrate.go): what the
	// built-in model alone achieves, for comparison (kvroute:uncalibrated).
	// The cache signal is still watched.
	NoCalibration bool
	// AdapterLoad is the time a backend takes to load a LoRA adapter it
	// does not hold (default DefaultAdapterLoad); MaxLoRAs the adapters
	// one batch may hold where the engine does not report it (default 1,
	// vLLM's). See lora.go.
	AdapterLoad time.Duration
	MaxLoRAs    int
}

func (c Config) withDefaults() Config {
	if c.BlockBytes <= 0 {
		c.BlockBytes = prefix.DefaultBlockBytes
	}
	if c.LoadFactor <= 0 {
		c.LoadFactor = 2
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Tokens == nil {
		c.Tokens = router.NewTokens()
	}
	if c.PeerMaxAge <= 0 {
		c.PeerMaxAge = DefaultPeerMaxAge
	}
	if c.Objective == "" {
		c.Objective = Objectives()[0]
	}
	if c.PruneLeast <= 0 {
		c.PruneLeast = defaultPruneLeast
	}
	if c.PruneHolders <= 0 {
		c.PruneHolders = defaultPruneHolders
	}
	if c.DefaultKVTokens <= 0 {
		c.DefaultKVTokens = 400_000
	}
	if c.AdapterLoad <= 0 {
		c.AdapterLoad = DefaultAdapterLoad
	}
	if c.MaxLoRAs <= 0 {
		c.MaxLoRAs = defaultMaxLoRAs
	}
	switch {
	case c.MissPenalty == 0:
		c.MissPenalty = 1
	case c.MissPenalty < 0:
		c.MissPenalty = 0
	}
	return c
}

// DefaultPeerMaxAge is Config.PeerMaxAge's default: ten of the
// peers' default polls (internal/peers), so that one lost poll does not
// drop a peer, yet short beside a stream's life.
const DefaultPeerMaxAge = time.Second

// DefaultPeerPush is Config.PeerPush's default in kvroute serve: a
// little longer than a pushed count takes to reach another replica
// (docs/decisions/0005-pushed-peer-counts.md).
const DefaultPeerPush = 2 * time.Millisecond

// maxSessions bounds the sessions kvroute remembers the backend of; past
// it, they are forgotten wholesale (the index still knows their prompts).
const maxSessions = 1 << 17

// NewKVRoute returns the policy for a fleet of backends (their Index fields
// number them 0..len-1).
func New(backends []*fleet.Backend, cfg Config) *Policy {
	cfg = cfg.withDefaults()
	n := 0
	for _, b := range backends {
		n = max(n, b.Index+1)
	}
	p := &Policy{
		cfg:      cfg,
		rand:     router.NewRand(cfg.Seed),
		sessions: make(map[string]int),
		queue:    make([]drain, n),
		shares:   make([]share, n),
		epoch:    cfg.Now(),
		outputs:  newOutputs(),
	}
	p.index = prefix.NewTiered(n, p.blocksFor(cfg.DefaultKVTokens), recentFactor*p.blocksFor(cfg.DefaultKVTokens))
	p.learner.init(n)
	p.cal.init(cfg, n)
	members := slices.Clone(backends)
	p.members.Store(&members)
	p.prune.weighPeers(p, backends)
	p.prune.setBackends(backends)
	p.setLanes(backends)
	p.width.Store(int64(n))
	p.scratch.New = func() any {
		n := p.width.Load()
		return &pickScratch{matched: make([]int, n), recent: make([]int, n)}
	}
	return p
}

// SetBackends implements FleetWatcher: it makes room for new backends'
// indexes in the queue model, the learner and the prefix index, and
// forgets removed backends' blocks, queue and learned slowness.
func (p *Policy) SetBackends(backends []*fleet.Backend) {
	n := 0
	for _, b := range backends {
		n = max(n, b.Index+1)
	}
	gone := p.learner.setBackends(backends)
	p.prune.weighPeers(p, backends)
	p.prune.setBackends(backends)
	p.setLanes(backends)
	p.index.Grow(n)
	for _, i := range gone {
		p.index.Clear(i)
	}
	p.cal.grow(n, gone)
	members := slices.Clone(backends)
	p.members.Store(&members)
	p.mu.Lock()
	if len(p.queue) < n {
		p.queue = append(p.queue, make([]drain, n-len(p.queue))...)
		p.shares = append(p.shares, make([]share, n-len(p.shares))...)
	}
	for _, i := range gone {
		p.queue[i], p.shares[i] = drain{}, share{}
	}
	p.mu.Unlock()
	if int64(n) > p.width.Load() {
		p.width.Store(int64(n))
	}
}

// backends returns the fleet's backends as SetBackends last told them.
func (p *Policy) backends() []*fleet.Backend { return *p.members.Load() }

// Name implements Policy.
func (*Policy) Name() string { return "kvroute" }

// arrivalRate returns the requests a second the policy has routed lately,
// and counts one more. Call with mu held.
func (p *Policy) arrivalRate(now time.Time) float64 {
	if !p.arrivedAt.IsZero() {
		p.arrivals *= math.Exp(-now.Sub(p.arrivedAt).Seconds() / arrivalWindow)
	}
	p.arrivals++
	p.arrivedAt = now
	return p.arrivals / arrivalWindow
}

// blocksFor converts a KV capacity in tokens into index blocks.
func (p *Policy) blocksFor(tokens int) int {
	return max(1, int(float64(tokens)*p.cfg.Tokens.Ratio()/float64(p.cfg.BlockBytes)))
}
