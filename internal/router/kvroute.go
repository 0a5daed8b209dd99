package router

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/prefix"
)

var (
	_ Policy  = (*KVRoute)(nil)
	_ Learner = (*KVRoute)(nil)
)

// KVRoute is kvroute's own policy. For every candidate it predicts the
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
// price the rest of the fleet pays for a recomputed prefix. It picks the
// lowest cost; among near-ties (within 10 % or 5 ms) the session's backend,
// else the one expected to hold most of the prompt, else at random. A conversation or a hot prefix therefore stays where
// its cache is until the queue there costs more than prefilling elsewhere;
// then it spills to the next cheapest backend, and the index remembers both,
// so the prefix spreads to as few backends as the load needs. No backend may
// take more than LoadFactor times the mean in-flight requests (plus four).
type KVRoute struct {
	cfg  KVRouteConfig
	rand *lockedRand
	// index is two tiers over one table of blocks: tier 0 what each
	// backend holds, as an LRU of the prompts routed there bounded by its
	// KV capacity; tier 1 (recent) remembers recentFactor times as many
	// blocks per backend: what it probably holds and what it held until
	// lately. An
	// engine's cache is not the index's LRU of routed prompts (it keeps a
	// request's blocks from when it finishes, keeps what running requests
	// hold, evicts sooner when requests wait for memory), so a prefix the
	// index has just forgotten is often still there; and where it is not,
	// recomputing it there costs no more than anywhere else. Forgetting it
	// outright moved conversations off the backend that still held them.
	// One table for both: each block is looked up once per request, which
	// at a thousand backends is a third of a decision's time.
	index *prefix.Index

	mu     sync.Mutex
	pooled speed // learned from every backend
	// slowness is each backend's observed TTFT over the pooled fit's
	// prediction, as decayed sums (by backend index). A fleet is mostly
	// alike; fitting each backend alone lets a few long prompts give one
	// a rate far off the others' and draw every long prompt to it.
	observed, predicted []float64
	// sumSlow is Σ observed/predicted over the backends: predictions use
	// each backend's slowness relative to the fleet's mean, so that what the
	// pooled fit got wrong while it was learning cancels out.
	sumSlow  float64
	capacity []int // index capacity in blocks last derived from Info, by backend index
	// hold is the learned mean time a token of KV is held, in seconds: the
	// requests' lifetimes weighted by their tokens (decayed sums), since
	// the long requests are the ones that hold the cache.
	holdSum, holdWeight float64
	// life is the mean time a request is in flight, in seconds (decayed
	// sums): how long a slot stays taken.
	lifeSum, lifeN float64
	// ratio is the learned prompt bytes per token: decayed sums of bytes
	// and tokens, so that long prompts, whose estimate matters, weigh
	// most (short ones carry the chat template's fixed tokens).
	ratio                   float64
	ratioBytes, ratioTokens float64
	sessions                map[string]int
	// pending holds, for each routed request whose backend held more of it
	// in recent than in index, the two, until its outcome says how much of
	// the difference was cached.
	pending map[*Request]tiers
	// recentHit and recentSeen are decayed sums of the prompt tokens that
	// recent alone predicted cached on the chosen backend and of those the
	// backend had: their ratio is the odds that such a token is cached.
	recentHit, recentSeen float64
	// queue is each backend's prefill work ahead of a new request as of a
	// moment, by backend index: the router's count of the prefill it sent
	// there overstates it as soon as the backend starts computing, and a
	// long prompt half done is half the wait.
	queue []drain
	// epoch is when the policy was made: queue times are seconds since it,
	// cheaper to subtract for a thousand backends than time.Time.
	epoch time.Time
	// arrivals counts the requests routed, decayed over arrivalWindow
	// seconds, as of arrivedAt.
	arrivals  float64
	arrivedAt time.Time

	scratch sync.Pool // *pickScratch
}

// KVRouteConfig tunes the kvroute policy. Zero values take the defaults.
type KVRouteConfig struct {
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
	// Options.Metrics); kvroute reads how many requests an engine runs at
	// once where it says (llama.cpp's slots). Nil means none.
	Metrics func(*fleet.Backend) *fleet.Metrics
	// Replicas is the number of router replicas sharing the fleet behind a
	// random split (default 1); with more, each scales its counts of the
	// load and places sessions it does not know by consistent hashing (see
	// kvroute_replicas.go).
	Replicas int
}

func (c KVRouteConfig) withDefaults() KVRouteConfig {
	if c.BlockBytes <= 0 {
		c.BlockBytes = prefix.DefaultBlockBytes
	}
	if c.LoadFactor <= 0 {
		c.LoadFactor = 2
	}
	if c.Now == nil {
		c.Now = time.Now
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

const (
	defaultRatio  = 4.0 // bytes of prompt text per token
	priorTokens   = 1000.0
	ratioDecay    = 1 - 1.0/64
	defaultOutput = 256 // tokens expected when a request does not say
	priorHold     = 5.0 // seconds a token of KV is held, until observed
	holdDecay     = 1 - 1.0/256
	maxSessions   = 1 << 17
	tieTolerance  = 0.1   // relative: learned speeds carry noise of this order
	tieFloor      = 0.005 // s
	priorSlowness = 20.0  // s of TTFT behind the prior that a backend is as fast as the fleet
	slownessDecay = 1 - 1.0/500
	speedNoise    = 0.05 // relative error of a predicted prefill: ties within it
	arrivalWindow = 30.0 // s
	// loadSlack is what the load bound allows above LoadFactor × the mean
	// in-flight requests: at light load, with one or two requests a
	// backend, a slack of one moved conversations off their caches (chat
	// on 32 servers: 70 % of prompt tokens cached against 80 % with 4).
	loadSlack      = 4
	capacityShrink = 0.9
	// recentTier is the index's tier of what backends held lately, and
	// recentFactor how many times its KV capacity that tier remembers of
	// each backend. Measured in the simulator on Mooncake
	// (docs/routing.md): 2 kept most of what staying on a backend could
	// gain.
	recentTier   = 1
	recentFactor = 2
	priorRecent  = 10_000.0 // tokens, half of them cached, until observed
	recentDecay  = 1 - 1.0/64
)

// tiers is what the two indexes predicted cached of a request on its
// backend, in tokens.
type tiers struct{ sure, maybe int }

// NewKVRoute returns the policy for a fleet of backends (their Index fields
// number them 0..len-1).
func NewKVRoute(backends []*fleet.Backend, cfg KVRouteConfig) *KVRoute {
	cfg = cfg.withDefaults()
	n := 0
	for _, b := range backends {
		n = max(n, b.Index+1)
	}
	p := &KVRoute{
		cfg:        cfg,
		rand:       newRand(cfg.Seed),
		observed:   make([]float64, n),
		predicted:  make([]float64, n),
		capacity:   make([]int, n),
		ratio:      defaultRatio,
		sessions:   make(map[string]int),
		pending:    make(map[*Request]tiers),
		recentHit:  priorRecent / 2,
		recentSeen: priorRecent,
		queue:      make([]drain, n),
		epoch:      cfg.Now(),
	}
	p.index = prefix.NewTiered(n, p.blocksFor(cfg.DefaultKVTokens), recentFactor*p.blocksFor(cfg.DefaultKVTokens))
	p.pooled = newSpeed()
	p.holdSum, p.holdWeight = priorHold, 1
	p.lifeSum, p.lifeN = priorHold, 1
	p.ratioBytes, p.ratioTokens = defaultRatio*priorTokens, priorTokens
	for i := range n {
		p.observed[i], p.predicted[i] = priorSlowness, priorSlowness
	}
	p.sumSlow = float64(n)
	p.scratch.New = func() any { return &pickScratch{matched: make([]int, n), recent: make([]int, n)} }
	return p
}

// Name implements Policy.
func (*KVRoute) Name() string { return "kvroute" }

// drain is a fluid model of one backend's prefill queue: work seconds of
// prefill at the moment at (seconds since the policy's epoch), computed
// since at one second a second.
type drain struct {
	work float64
	at   float64
}

// left returns the seconds of prefill still ahead at now on a backend where
// the prompt tokens the router sent that still await their first token
// would take most seconds to compute from scratch: never more, and none
// when none do.
func (d drain) left(now, most float64) float64 {
	return max(0, min(d.work-(now-d.at), most))
}

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
}

// arrivalRate returns the requests a second the policy has routed lately,
// and counts one more.
func (p *KVRoute) arrivalRate(now time.Time) float64 {
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
	cand    []candidate
}

// blocksFor converts a KV capacity in tokens into index blocks.
func (p *KVRoute) blocksFor(tokens int) int {
	return max(1, int(float64(tokens)*p.ratio/float64(p.cfg.BlockBytes)))
}

// Pick implements Policy.
func (p *KVRoute) Pick(req *Request, cands []*fleet.Backend) (Decision, error) {
	if len(cands) == 0 {
		return Decision{}, ErrNoBackend
	}
	s := p.scratch.Get().(*pickScratch)
	defer p.scratch.Put(s)
	s.hashes = req.prefixHashes(s.hashes[:0], p.cfg.BlockBytes)
	longest := p.index.Match(s.hashes, s.matched, s.recent)

	var total int64
	s.loads = slices.Grow(s.loads[:0], len(cands))[:len(cands)]
	loads := s.loads
	for i, b := range cands {
		loads[i] = p.load(b)
		total += loads[i].Requests
	}
	bound := p.cfg.LoadFactor*float64(total+1)/float64(len(cands)) + loadSlack

	now := p.cfg.Now()
	nowS := now.Sub(p.epoch).Seconds()
	p.mu.Lock()
	ratio := p.ratio
	session, hasSession := p.sessions[req.SessionKey]
	hasSession = hasSession && req.SessionKey != ""
	promptTokens := req.promptTokens(ratio)
	need := float64(promptTokens + max(req.MaxTokens, defaultOutput))
	s.cand = slices.Grow(s.cand[:0], len(cands))[:len(cands)]
	cand := s.cand
	clear(cand)
	meanSlow := p.sumSlow / float64(len(p.observed))
	backlog := math.Inf(1)
	odds := p.recentHit / p.recentSeen
	for i, b := range cands {
		c := &cand[i]
		c.sure = min(promptTokens, int(float64(s.matched[b.Index]*p.cfg.BlockBytes)/ratio))
		c.maybe = max(c.sure, min(promptTokens, int(float64(s.recent[b.Index]*p.cfg.BlockBytes)/ratio)))
		c.cached = c.sure + int(odds*float64(c.maybe-c.sure))
		c.slow = p.observed[b.Index] / p.predicted[b.Index] / meanSlow
		c.miss = float64(promptTokens - c.cached)
		if loads[i].PrefillTokens > 0 {
			c.queued = p.queue[b.Index].left(nowS, c.slow*p.pooled.prefill(float64(loads[i].PrefillTokens), 0))
		}
		c.own = c.slow * p.pooled.prefill(c.miss, float64(c.cached))
		backlog = min(backlog, c.queued)
	}
	// The miss penalty grows with the backlog every backend has: once the
	// whole fleet is queued, a recomputed prefix delays each request that
	// arrives behind it there, about one per mean gap between arrivals, for
	// as long as the least loaded backend's queue.
	penalty := p.cfg.MissPenalty * (1 + p.arrivalRate(now)/float64(len(cands))*backlog)
	best, floor, floorTTFT := -1, math.Inf(1), math.Inf(1)
	for i, b := range cands {
		c := &cand[i]
		ttft := c.queued + c.slow*p.pooled.predict(c.miss, float64(c.cached), float64(loads[i].Decoding))
		// A request waits for KV memory when what the backend's requests
		// hold plus what it needs exceeds the cache: until enough of them
		// finish, at about a cache's worth per mean holding time.
		kv := float64(p.cfg.DefaultKVTokens)
		if info := b.Info(); info != nil && info.KVTokens() > 0 {
			kv = float64(info.KVTokens())
		}
		if excess := float64(loads[i].DecodeTokens) + need - kv; excess > 0 {
			ttft += excess / kv * (p.holdSum / p.holdWeight)
		}
		// An engine that runs a fixed number of requests at once (llama.cpp's
		// slots) queues the rest whole: the request waits for as many of
		// them to finish as are ahead of it, a slot's worth per mean
		// lifetime each.
		if p.cfg.Metrics != nil {
			if m := p.cfg.Metrics(b); m != nil && m.Slots > 0 {
				if ahead := loads[i].Requests + 1 - int64(m.Slots); ahead > 0 {
					ttft += float64(ahead) / float64(m.Slots) * (p.lifeSum / p.lifeN)
				}
			}
		}
		cost := ttft + penalty*c.own
		if float64(loads[i].Requests+1) > bound {
			cost = math.Inf(1) // over the load bound: only if all are
		}
		c.ttft, c.cost = ttft, cost
		if best < 0 || cost < cand[best].cost {
			best = i
		}
		// The cost on an idle backend: what no choice can avoid, and the
		// TTFT there, whose error makes near costs ties.
		floor = min(floor, c.slow*p.pooled.overhead+(1+penalty)*c.own)
		floorTTFT = min(floorTTFT, c.slow*p.pooled.overhead+c.own)
	}
	if math.IsInf(cand[best].cost, 1) {
		// Every backend is over the bound (the slack above the mean makes
		// this impossible, short of counts changing under Pick): fall back
		// to the least loaded.
		b := leastLoaded(cands, p.rand)
		for i := range cands {
			if cands[i] == b {
				best = i
			}
		}
	} else {
		best = p.breakTie(cand, cands, best, floor, floorTTFT, session, hasSession, p.placementKey(req, s.hashes))
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
		work = cb.slow * p.pooled.prefill(float64(promptTokens-cb.sure), float64(cb.sure))
		if len(p.pending) >= maxSessions {
			clear(p.pending) // outcomes that never came; the odds lose a few samples
		}
		p.pending[req] = tiers{sure: cb.sure, maybe: cb.maybe}
	}
	p.queue[chosen.Index] = drain{work: cb.queued + work, at: nowS}
	p.mu.Unlock()

	d := Decision{
		Backend:       chosen,
		PromptTokens:  promptTokens,
		PrefixTokens:  cb.sure,
		OutputTokens:  req.MaxTokens,
		QueuedTokens:  int(loads[best].PrefillTokens),
		Decoding:      int(loads[best].Decoding),
		PredictedTTFT: seconds(cand[best].ttft),
		Scores:        explain(cand, cands, best),
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
	if req.SessionKey != "" {
		p.mu.Lock()
		if len(p.sessions) >= maxSessions {
			clear(p.sessions) // forget old sessions wholesale; the index still knows their prompts
		}
		p.sessions[req.SessionKey] = chosen.Index
		p.mu.Unlock()
	}
	return d, nil
}

// breakTie returns, among the candidates whose cost is within the tolerance
// of the best, the session's backend when it is one, else one of those
// expected to hold the most of the prompt, at random. The tolerance is
// relative to the part of the cost that depends on the choice (the best cost
// above the floor, the cheapest idle backend's), plus the prediction's own
// error on the request's prefill: a long prompt's prefill seconds are no
// reason to call a half-second difference in queues a tie, nor is a learned
// speed's noise a reason to herd onto one backend.
//
// Within the tolerance the predictions cannot tell the candidates apart, but
// the cache can: a random pick among them moved conversations off their
// prefix whenever every backend waited for KV memory (the waits make the
// tolerance seconds wide), and each move recomputed the prefix and spent
// cache on a second copy. An idle fleet, where no candidate holds more than
// another, still spreads its work at random.
func (p *KVRoute) breakTie(cand []candidate, cands []*fleet.Backend, best int, floor, floorTTFT float64, session int, hasSession bool, key uint64) int {
	if key != 0 && !hasSession {
		return placeByKey(cand, cands, best, key)
	}
	c := cand[best].cost
	limit := c + max(tieFloor, tieTolerance*max(0, c-floor)+speedNoise*floorTTFT)
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
	// One draw for the lot: in a large idle fleet most backends tie.
	k := p.rand.IntN(ties)
	for i := range cand {
		if cand[i].cost <= limit && cand[i].cached == most {
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
func explain(cand []candidate, cands []*fleet.Backend, best int) []Score {
	score := func(i int) Score {
		return Score{Backend: cands[i].Name, Cost: cand[i].cost, TTFT: seconds(cand[i].ttft), Cached: cand[i].cached}
	}
	scores := make([]Score, 0, min(len(cands), maxScores))
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

// Observe implements Learner: it learns prompt bytes per token and each
// backend's TTFT model, corrects the index's capacity for a backend whose
// cache held less than predicted, and forgets what a failed request was
// expected to leave in a backend's cache.
func (p *KVRoute) Observe(o Outcome) {
	b := o.Decision.Backend
	if b == nil {
		return
	}
	if o.Status == 0 || o.Status >= 500 {
		// The backend never computed the prompt: take back what Pick told
		// the index it would hold beyond what it held already.
		p.mu.Lock()
		held := int(float64(o.Decision.PrefixTokens) * p.ratio / float64(p.cfg.BlockBytes))
		t, ok := p.pending[o.Request]
		delete(p.pending, o.Request)
		maybe := held
		if ok {
			maybe = int(float64(t.maybe) * p.ratio / float64(p.cfg.BlockBytes))
		}
		p.mu.Unlock()
		hashes := o.Request.prefixHashes(nil, p.cfg.BlockBytes)
		p.index.Forget(b.Index, hashes, held)
		p.index.ForgetTier(recentTier, b.Index, hashes, maybe)
		return
	}
	if o.Status != 200 || o.PromptTokens <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.pending[o.Request]; ok {
		delete(p.pending, o.Request)
		if o.CachedTokens >= 0 {
			extra := float64(t.maybe - t.sure)
			p.recentHit = p.recentHit*recentDecay + clamp(float64(o.CachedTokens-t.sure), 0, extra)
			p.recentSeen = p.recentSeen*recentDecay + extra
		}
	}
	if len(o.Request.Prompt) > 0 {
		p.ratioBytes = p.ratioBytes*ratioDecay + float64(len(o.Request.Prompt))
		p.ratioTokens = p.ratioTokens*ratioDecay + float64(o.PromptTokens)
		p.ratio = p.ratioBytes / p.ratioTokens
	}
	if o.Latency > 0 {
		w := float64(o.PromptTokens + max(o.CompletionTokens, 0))
		p.holdSum = p.holdSum*holdDecay + w*o.Latency.Seconds()
		p.lifeSum = p.lifeSum*holdDecay + o.Latency.Seconds()
		p.lifeN = p.lifeN*holdDecay + 1
		p.holdWeight = p.holdWeight*holdDecay + w
	}
	// Speeds are learned only from requests that found no prefill waiting
	// on their backend (the router's exact count): their TTFT is their own
	// prefill. With a queue ahead, how much of it was still to do is itself
	// an estimate from the learned rate, and fitting the rate to it feeds
	// its errors back into it.
	if o.CachedTokens >= 0 && o.TTFT > 0 && o.Decision.QueuedTokens == 0 {
		m, c := float64(o.PromptTokens-o.CachedTokens), float64(o.CachedTokens)
		decoding := float64(o.Decision.Decoding)
		i := b.Index
		p.sumSlow -= p.observed[i] / p.predicted[i]
		p.observed[i] = p.observed[i]*slownessDecay + o.TTFT.Seconds()
		p.predicted[i] = p.predicted[i]*slownessDecay + p.pooled.predict(m, c, decoding)
		p.sumSlow += p.observed[i] / p.predicted[i]
		p.pooled.observe(m, c, decoding, o.TTFT.Seconds())
	}
	// Capacity: the KV the backend reports, in blocks of prompt text; shrunk
	// when the backend had evicted what the index still believed cached (it
	// serves other traffic, or its cache is smaller than it says), regrown
	// slowly when predictions hold.
	full := p.blocksFor(p.cfg.DefaultKVTokens)
	if info := b.Info(); info != nil && info.KVTokens() > 0 {
		full = p.blocksFor(info.KVTokens())
	}
	c := p.capacity[b.Index]
	if c == 0 || c > full {
		c = full
	}
	blockTokens := int(float64(p.cfg.BlockBytes) / p.ratio)
	switch {
	case o.CachedTokens < 0:
	case o.CachedTokens+blockTokens < o.Decision.PrefixTokens:
		c = max(1, int(float64(c)*capacityShrink))
	case c < full:
		c = min(full, c+max(1, full/256))
	}
	if c != p.capacity[b.Index] {
		p.capacity[b.Index] = c
		p.index.SetCapacity(b.Index, c)
	}
	if p.index.TierCapacity(recentTier, b.Index) != recentFactor*full {
		p.index.SetTierCapacity(recentTier, b.Index, recentFactor*full)
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func clamp(x, lo, hi float64) float64 { return math.Max(lo, math.Min(hi, x)) }
