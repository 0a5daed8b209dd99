package router

import (
	"math"
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
// the prefix index, overhead, rate and slowdown are learned per backend from
// observed TTFTs (pooled over the fleet until a backend has its own
// samples), and the KV wait is the time until b's cache has room for the
// request: the tokens b's requests hold plus the request's own beyond b's
// KV capacity, freed at about one cache's worth per mean request lifetime
// (also learned).
//
// To that it adds the uncached prefill once more, times MissPenalty: the
// price the rest of the fleet pays for a recomputed prefix. It picks the
// lowest cost, at random among near-ties (within 10 % or 5 ms), preferring
// the session's backend. A conversation or a hot prefix therefore stays where
// its cache is until the queue there costs more than prefilling elsewhere;
// then it spills to the next cheapest backend, and the index remembers both,
// so the prefix spreads to as few backends as the load needs. No backend may
// take more than LoadFactor times the mean in-flight requests (plus one).
type KVRoute struct {
	cfg   KVRouteConfig
	rand  *lockedRand
	index *prefix.Index

	mu       sync.Mutex
	pooled   speed   // learned from every backend: the prior of each
	speeds   []speed // by backend index
	capacity []int   // index capacity in blocks last derived from Info, by backend index
	// hold is the learned mean time a token of KV is held, in seconds: the
	// requests' lifetimes weighted by their tokens (decayed sums), since
	// the long requests are the ones that hold the cache.
	holdSum, holdWeight float64
	ratio               float64 // learned prompt bytes per token
	ratioN              int     // observations behind ratio, up to 64
	sessions            map[string]int

	scratch sync.Pool // *pickScratch
}

// KVRouteConfig tunes the kvroute policy. Zero values take the defaults.
type KVRouteConfig struct {
	// BlockBytes is the prefix index's block size in bytes of prompt text
	// (default prefix.DefaultBlockBytes).
	BlockBytes int
	// LoadFactor bounds every backend's in-flight requests to LoadFactor ×
	// the mean + 1 (default 2).
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
	defaultRatio   = 4.0 // bytes of prompt text per token
	defaultOutput  = 256 // tokens expected when a request does not say
	priorHold      = 5.0 // seconds a token of KV is held, until observed
	holdDecay      = 1 - 1.0/256
	maxSessions    = 1 << 17
	tieTolerance   = 0.1   // relative: learned speeds carry noise of this order
	tieFloor       = 0.005 // s
	ownSamples     = 16    // observations before a backend's own fit replaces the pooled one
	capacityShrink = 0.9
)

// NewKVRoute returns the policy for a fleet of backends (their Index fields
// number them 0..len-1).
func NewKVRoute(backends []*fleet.Backend, cfg KVRouteConfig) *KVRoute {
	cfg = cfg.withDefaults()
	n := 0
	for _, b := range backends {
		n = max(n, b.Index+1)
	}
	p := &KVRoute{
		cfg:      cfg,
		rand:     newRand(cfg.Seed),
		speeds:   make([]speed, n),
		capacity: make([]int, n),
		ratio:    defaultRatio,
		sessions: make(map[string]int),
	}
	p.index = prefix.New(n, p.blocksFor(cfg.DefaultKVTokens))
	p.pooled = newSpeed()
	p.holdSum, p.holdWeight = priorHold, 1
	for i := range p.speeds {
		p.speeds[i] = newSpeed()
	}
	p.scratch.New = func() any { return &pickScratch{matched: make([]int, n)} }
	return p
}

// Name implements Policy.
func (*KVRoute) Name() string { return "kvroute" }

type pickScratch struct {
	hashes  []uint64
	matched []int
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
	longest := p.index.Match(s.hashes, s.matched)

	var total int64
	loads := make([]fleet.Load, len(cands))
	for i, b := range cands {
		loads[i] = p.load(b)
		total += loads[i].Requests
	}
	bound := p.cfg.LoadFactor*float64(total+1)/float64(len(cands)) + 1

	p.mu.Lock()
	ratio := p.ratio
	session, hasSession := p.sessions[req.SessionKey]
	hasSession = hasSession && req.SessionKey != ""
	promptTokens := req.promptTokens(ratio)
	need := float64(promptTokens + max(req.MaxTokens, defaultOutput))
	scores := make([]Score, len(cands))
	best := -1
	for i, b := range cands {
		cached := min(promptTokens, int(float64(s.matched[b.Index]*p.cfg.BlockBytes)/ratio))
		sp := &p.pooled
		if p.speeds[b.Index].n >= ownSamples {
			sp = &p.speeds[b.Index]
		}
		miss := float64(promptTokens - cached)
		ttft := sp.predict(float64(loads[i].PrefillTokens)+miss, float64(loads[i].Decoding))
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
		cost := ttft + p.cfg.MissPenalty*miss/sp.rate
		if float64(loads[i].Requests+1) > bound {
			cost = math.Inf(1) // over the load bound: only if all are
		}
		scores[i] = Score{Backend: b.Name, Cost: cost, TTFT: seconds(ttft), Cached: cached}
		if best < 0 || cost < scores[best].Cost {
			best = i
		}
	}
	p.mu.Unlock()
	if math.IsInf(scores[best].Cost, 1) {
		// Every backend is over the bound (cannot happen with the +1 slack
		// unless the fleet is tiny): fall back to the least loaded.
		b := leastLoaded(cands, p.rand)
		for i := range cands {
			if cands[i] == b {
				best = i
			}
		}
	} else {
		best = p.breakTie(scores, cands, best, session, hasSession, p.placementKey(req, s.hashes))
	}

	chosen := cands[best]
	d := Decision{
		Backend:       chosen,
		PromptTokens:  promptTokens,
		PrefixTokens:  scores[best].Cached,
		OutputTokens:  req.MaxTokens,
		QueuedTokens:  int(loads[best].PrefillTokens),
		Decoding:      int(loads[best].Decoding),
		PredictedTTFT: scores[best].TTFT,
		Scores:        scores,
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

// breakTie returns a random candidate among those whose cost is within the
// tolerance of the best, preferring the session's backend when it is one.
func (p *KVRoute) breakTie(scores []Score, cands []*fleet.Backend, best, session int, hasSession bool, key uint64) int {
	if key != 0 && !hasSession {
		return placeByKey(scores, cands, best, key)
	}
	limit := scores[best].Cost + math.Max(scores[best].Cost*tieTolerance, tieFloor)
	ties, pick := 0, best
	for i := range scores {
		if scores[i].Cost > limit {
			continue
		}
		if hasSession && cands[i].Index == session {
			return i
		}
		ties++
		if p.rand.IntN(ties) == 0 {
			pick = i
		}
	}
	return pick
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
		p.mu.Unlock()
		p.index.Forget(b.Index, prefix.Hash(nil, o.Request.Prompt, p.cfg.BlockBytes), held)
		return
	}
	if o.Status != 200 || o.PromptTokens <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(o.Request.Prompt) > 0 {
		// A running mean at first, then a moving one over about 64
		// requests.
		r := float64(len(o.Request.Prompt)) / float64(o.PromptTokens)
		p.ratioN = min(p.ratioN+1, 64)
		p.ratio += (r - p.ratio) / float64(p.ratioN)
	}
	if o.Latency > 0 {
		w := float64(o.PromptTokens + max(o.CompletionTokens, 0))
		p.holdSum = p.holdSum*holdDecay + w*o.Latency.Seconds()
		p.holdWeight = p.holdWeight*holdDecay + w
	}
	if o.CachedTokens >= 0 && o.TTFT > 0 {
		work := float64(o.Decision.QueuedTokens + o.PromptTokens - o.CachedTokens)
		decoding := float64(o.Decision.Decoding)
		p.speeds[b.Index].observe(work, decoding, o.TTFT.Seconds())
		p.pooled.observe(work, decoding, o.TTFT.Seconds())
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
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func clamp(x, lo, hi float64) float64 { return math.Max(lo, math.Min(hi, x)) }
