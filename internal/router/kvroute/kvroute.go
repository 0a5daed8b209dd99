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

// DefaultPeerPush is Config.PeerPush's default in kvroute serve:
// a pushed count reached another replica 0.8 ms after the change at the
// median and 1.5 ms on average on a loaded machine (docs/BENCHMARKS.md,
// Router replicas).
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

// Name implements Policy.
func (*Policy) Name() string { return "kvroute" }

// candidate is what Pick works out about one backend before costing it.
type candidate struct {
	cached int     // prompt tokens expected cached there
	sure   int     // of which the index holds
	maybe  int     // prompt tokens recent holds there
	miss   float64 // prompt tokens to compute there
	slow   float64 // its TTFTs over the fleet's, relative to the mean
	queued float64 // seconds of prefill ahead there
	own    float64 // seconds of the request's own prefill there
	ttft   float64 // predicted TTFT there, seconds
	cost   float64 // what the choice minimises
	stream float64 // of which the stream's price (decode.go)
}

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

type pickScratch struct {
	hashes  []uint64
	matched []int
	recent  []int // blocks matched in recent
	loads   []fleet.Load
	peer    []peerPrefill // the prefill in loads the other replicas reported
	drains  []drain
	shares  []float64 // prefill seconds a second sent lately, by candidate
	inverse []float64 // mean 1/tokens of the streams in flight, by candidate
	cand    []candidate
	events  []router.KVState // by candidate, when Events is set
	stream  streamCost
	tpot    []float64        // the stream's per-token time, by candidate (goodput)
	pushed  []float64        // streams pushed over the objective, by candidate (goodput)
	one     bool             // this pick decides as one router (asOne)
	lane    laneScratch      // a burst's pick within this replica's lane
	few     []int32          // a pruned pick's backends, by index
	sub     []*fleet.Backend // and as candidates
}

// blocksFor converts a KV capacity in tokens into index blocks.
func (p *Policy) blocksFor(tokens int) int {
	return max(1, int(float64(tokens)*p.cfg.Tokens.Ratio()/float64(p.cfg.BlockBytes)))
}

// Pick implements Policy.
func (p *Policy) Pick(req *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	if len(cands) == 0 {
		return router.Decision{}, router.ErrNoBackend
	}
	s := p.scratch.Get().(*pickScratch)
	defer p.scratch.Put(s)
	if n := int(p.width.Load()); len(s.matched) < n { // the fleet grew
		s.matched, s.recent = make([]int, n), make([]int, n)
	}
	s.hashes = req.PrefixHashes(s.hashes[:0], p.cfg.BlockBytes)
	fleetSize := len(cands)
	now := p.cfg.Now()
	var lanes bool
	s.one, lanes = p.mode(now)
	var mine lane // every backend, but in a burst behind replicas (inLane)
	if lanes {
		mine = p.lane()
	}
	cands, longest, inFlight := p.match(s, req, cands, mine) // all, or the few that can win (prune.go)
	if p.cfg.Events != nil {
		s.events = slices.Grow(s.events[:0], len(cands))[:len(cands)]
		p.cfg.Events.Match(req, cands, s.events)
	}
	ln := p.learner.snapshot()
	ratio := p.cfg.Tokens.Ratio()
	promptTokens := req.PromptTokensAt(ratio)

	var total int64
	s.loads = slices.Grow(s.loads[:0], len(cands))[:len(cands)]
	s.drains = slices.Grow(s.drains[:0], len(cands))[:len(cands)]
	s.peer = slices.Grow(s.peer[:0], len(cands))[:len(cands)]
	loads := s.loads
	for i, b := range cands {
		loads[i], s.peer[i] = p.load(b, now)
		total += loads[i].Requests
	}
	if inFlight >= 0 {
		total = inFlight
	}
	bound := loadBound(p.cfg.LoadFactor, total, fleetSize)

	nowS := now.Sub(p.epoch).Seconds()
	p.mu.Lock()
	session, hasSession := p.sessions[req.SessionKey]
	hasSession = hasSession && req.SessionKey != ""
	streams := p.cfg.Objective != ObjectiveTTFT
	s.shares = slices.Grow(s.shares[:0], len(cands))[:len(cands)]
	s.inverse = slices.Grow(s.inverse[:0], len(cands))[:len(cands)]
	for i, b := range cands {
		if loads[i].PrefillTokens > 0 { // else nothing is queued there
			s.drains[i] = p.queue[b.Index]
		}
		if streams {
			s.shares[i] = p.shares[b.Index].now(nowS)
			s.inverse[i] = p.shares[b.Index].meanInverse()
		}
	}
	rate := p.arrivalRate(now)
	p.mu.Unlock()

	cand, backlog := p.candidates(s, cands, ln, ratio, promptTokens, nowS)
	penalty := missPenalty(p.cfg.MissPenalty, rate, fleetSize, backlog)
	stream := p.stream(req, s, ln, promptTokens)
	best, floor, floorTTFT := p.cost(cand, cands, loads, ln, penalty, bound, stream)
	if math.IsInf(cand[best].cost, 1) {
		// Every backend is over the bound (the slack above the mean makes
		// this impossible, short of counts changing under Pick): fall back
		// to the least loaded.
		b := router.LeastLoaded(cands, p.rand.IntN)
		for i := range cands {
			if cands[i] == b {
				best = i
			}
		}
	} else {
		key := p.placementKey(req, s.hashes, s.one || lanes)
		decide := func(cand []candidate, cands []*fleet.Backend, best int) int {
			return p.breakTie(cand, cands, best, floor, floorTTFT, session, hasSession, key)
		}
		if lanes {
			best = p.inLane(s, mine, cand, cands, best, decide)
		} else {
			best = decide(cand, cands, best)
		}
	}
	chosen := cands[best]
	// The router counts the request's prefill, and the queue model adds it,
	// as if only the index's part were cached: when recent's part turns out
	// evicted, the requests routed behind it would otherwise have been told
	// the backend was seconds less busy than it is (Mooncake's 100k-token
	// prompts made the p99).
	cb := &cand[best]
	work := cb.own
	if cb.maybe > cb.sure {
		work = cb.slow * ln.speed.prefill(float64(promptTokens-cb.sure), float64(cb.sure))
	}
	pk := picked{policy: p, req: req, backend: chosen, sure: cb.sure, maybe: cb.maybe,
		queued: loads[best].PrefillTokens, decoding: loads[best].Decoding,
		requests: loads[best].Requests, kv: loads[best].DecodeTokens, work: work}
	d := router.Decision{
		Backend:       chosen,
		Cached:        cb.sure,
		PredictedTTFT: seconds(cb.ttft),
		Done:          func(o router.Outcome) { pk.done(o) }, // one allocation: pk lives in the closure
	}
	if !p.cfg.NoScores {
		d.Scores = explain(cand, cands, best)
	}
	switch {
	case longest > 0 && s.matched[chosen.Index] == longest:
		d.Reason = "prefix"
	case longest > 0:
		d.Reason = "spill"
	case hasSession && chosen.Index == session:
		d.Reason = "session"
	default:
		d.Reason = "least-cost"
	}
	p.index.Insert(chosen.Index, s.hashes)
	p.prune.routed(chosen)
	p.mu.Lock()
	p.queue[chosen.Index] = drain{work: cb.queued + work, at: nowS}
	pk.routed = p.shares[chosen.Index].routed
	p.shares[chosen.Index].add(nowS, work)
	if stream.on {
		pk.inverse = 1 / max(1, stream.out)
		p.shares[chosen.Index].inverse += pk.inverse
		p.shares[chosen.Index].streams++
	}
	if req.SessionKey != "" {
		if len(p.sessions) >= maxSessions {
			clear(p.sessions)
		}
		p.sessions[req.SessionKey] = chosen.Index
	}
	p.mu.Unlock()
	return d, nil
}

// candidates works out, for every candidate, the prompt tokens expected
// cached there, its slowness, the prefill queued ahead and the request's own
// prefill; and the least prefill queued on any (the fleet's backlog).
func (p *Policy) candidates(s *pickScratch, cands []*fleet.Backend, ln *learned, ratio float64, promptTokens int, nowS float64) ([]candidate, float64) {
	s.cand = slices.Grow(s.cand[:0], len(cands))[:len(cands)]
	cand := s.cand
	clear(cand)
	slow := p.learner.slowRatios()
	backlog := math.Inf(1)
	for i, b := range cands {
		c := &cand[i]
		c.sure = min(promptTokens, int(float64(s.matched[b.Index]*p.cfg.BlockBytes)/ratio))
		c.maybe = max(c.sure, min(promptTokens, int(float64(s.recent[b.Index]*p.cfg.BlockBytes)/ratio)))
		if p.cfg.Events != nil {
			c.sure, c.maybe = eventCached(s.events[i], c.sure, c.maybe)
		}
		c.cached = expectedCached(c.sure, c.maybe, ln.odds)
		c.slow = slowness(math.Float64frombits(slow[b.Index].Load()), ln.meanSlow)
		c.miss = float64(max(0, promptTokens-c.cached))
		if own := s.loads[i].PrefillTokens - s.peer[i].tokens; own > 0 {
			c.queued = s.drains[i].left(nowS, c.slow*ln.speed.prefill(float64(own), 0))
		}
		c.queued += s.peer[i].wait(func(tokens float64) float64 { return c.slow * ln.speed.prefill(tokens, 0) })
		c.own = c.slow * ln.speed.prefill(c.miss, float64(c.cached))
		backlog = min(backlog, c.queued)
	}
	return cand, backlog
}

// cost sets every candidate's predicted TTFT and cost, for a request that
// needs need tokens of KV, and returns the cheapest and the floor and TTFT
// floor of the tie window (see tieWindow).
func (p *Policy) cost(cand []candidate, cands []*fleet.Backend, loads []fleet.Load, ln *learned, penalty, bound float64, st *streamCost) (best int, floor, floorTTFT float64) {
	best, floor, floorTTFT = -1, math.Inf(1), math.Inf(1)
	for i, b := range cands {
		c := &cand[i]
		ttft := c.queued + c.slow*ln.speed.predict(c.miss, float64(c.cached), float64(loads[i].Decoding))
		kv := float64(p.cfg.DefaultKVTokens)
		if info := b.Info(); info != nil && info.KVTokens() > 0 {
			kv = float64(info.KVTokens())
		}
		ttft += kvWait(float64(loads[i].DecodeTokens), st.need, kv, ln.hold)
		if p.cfg.Metrics != nil {
			if m := p.cfg.Metrics(b); m != nil && m.Slots > 0 {
				ttft += slotWait(loads[i].Requests, m.Slots, ln.life)
			}
		}
		c.stream = st.cost(i, c, loads[i])
		cost := ttft + penalty*c.own + c.stream
		if float64(loads[i].Requests+1) > bound {
			cost = math.Inf(1) // over the load bound: only if all are
		}
		c.ttft, c.cost = ttft, cost
		if best < 0 || cost < cand[best].cost {
			best = i
		}
		// The cost on an idle backend: what no choice can avoid, and the
		// TTFT there, whose error makes near costs ties.
		floor = min(floor, c.slow*ln.speed.overhead+(1+penalty)*c.own+st.idle)
		floorTTFT = min(floorTTFT, c.slow*ln.speed.overhead+c.own)
	}
	best, floor = st.misses(cand, best, floor)
	return best, floor, floorTTFT + st.noise()
}

// breakTie returns, among the candidates whose cost is within the tie
// window of the best (tieWindow), the session's backend when it is one,
// else one of those expected to hold the most of the prompt, at random.
//
// Within the tolerance the predictions cannot tell the candidates apart, but
// the cache can: a random pick among them moved conversations off their
// prefix whenever every backend waited for KV memory (the waits make the
// tolerance seconds wide), and each move recomputed the prefix and spent
// cache on a second copy. An idle fleet, where no candidate holds more than
// another, still spreads its work at random.
func (p *Policy) breakTie(cand []candidate, cands []*fleet.Backend, best int, floor, floorTTFT float64, session int, hasSession bool, key uint64) int {
	if p.returns.place(key, hasSession, p.cfg.Replicas) {
		return p.placeByKey(cand, cands, best, key)
	}
	limit := tieWindow(cand[best].cost, floor, floorTTFT)
	ties, most := 0, -1
	for i := range cand {
		if cand[i].cost > limit {
			continue
		}
		if hasSession && cands[i].Index == session {
			return i
		}
		switch {
		case cand[i].cached > most:
			ties, most = 1, cand[i].cached
		case cand[i].cached == most:
			ties++
		}
	}
	by := math.Inf(1)
	if p.cfg.Objective == ObjectiveE2E {
		ties, by = soonestTies(cand, limit, most)
	}
	// One draw for the lot: in a large idle fleet most backends tie.
	k := p.rand.IntN(ties)
	for i := range cand {
		if cand[i].cost <= limit && cand[i].cached == most && cand[i].ttft <= by {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return best
}

// maxScores bounds the candidates a kvroute decision explains: with a
// thousand backends, a thousand scores per request would cost more to
// build than the decision and say nothing more than the cheapest few.
const maxScores = 16

// explain returns the decision's scores: every candidate's, in order, or
// in a larger fleet the chosen one's and the cheapest others', cheapest
// first.
func explain(cand []candidate, cands []*fleet.Backend, best int) []router.Score {
	score := func(i int) router.Score {
		return router.Score{Backend: cands[i].Name, Cost: cand[i].cost, TTFT: seconds(cand[i].ttft), Cached: cand[i].cached}
	}
	scores := make([]router.Score, 0, min(len(cands), maxScores))
	if len(cands) <= maxScores {
		for i := range cands {
			scores = append(scores, score(i))
		}
		return scores
	}
	// The cheapest others by insertion into a short sorted list: most
	// candidates cost one comparison with its last.
	var top [maxScores - 1]int
	n, worst := 0, math.Inf(1) // worst: the last kept's cost once the list is full
	for i := range cand {
		c := cand[i].cost
		if c >= worst || i == best {
			continue
		}
		j := min(n, len(top)-1)
		for j > 0 && cand[top[j-1]].cost > c {
			top[j] = top[j-1]
			j--
		}
		top[j] = i
		if n < len(top) {
			n++
		}
		if n == len(top) {
			worst = cand[top[n-1]].cost
		}
	}
	scores = append(scores, score(best))
	for _, i := range top[:n] {
		scores = append(scores, score(i))
	}
	return scores
}
