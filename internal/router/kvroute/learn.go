package kvroute

import (
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// learned is what kvroute has learned from outcomes, as one immutable
// snapshot: the learner publishes a new one after every outcome and Pick
// reads the latest without a lock.
type learned struct {
	speed    speed     // the TTFT model fitted over the whole fleet
	decode   decodeFit // the time between tokens, fitted over the whole fleet
	meanSlow float64   // the mean over backends of observed/predicted TTFT
	hold     float64   // mean seconds a token of KV is held
	life     float64   // mean seconds a request is in flight
	odds     float64   // that a token only recent remembers is still cached
	// decodeMix: the backends decode at speeds far apart (mixed.go); nil
	// on a fleet of one kind.
	decodeMix *decodeMix
}

// learner owns the decayed sums behind each learned value. Outcomes update
// it under mu; each update publishes a new snapshot (last) and the
// backend's slowness ratio, which picks read without the lock.
type learner struct {
	mu     sync.Mutex
	pooled speed
	decode decodeFit
	// slow is each backend's TTFTs over what the pooled fit predicted for
	// them, decodeSlow its times between tokens over the decode fit's.
	slow, decodeSlow ratios
	// decodeMix is what the spread of decodeSlow said decodeSeen streams
	// in (noteDecodeSpread).
	decodeMix  *decodeMix
	decodeSeen int
	// live marks the indexes of the backends in the fleet (SetBackends).
	live     []bool
	capacity []int // index capacity in blocks last derived from Info, by backend index
	// hold: the requests' lifetimes weighted by their tokens (decayed
	// sums), since the long requests are the ones that hold the cache;
	// life: their plain mean.
	holdSum, holdWeight float64
	lifeSum, lifeN      float64
	// recentHit and recentSeen are decayed sums of the prompt tokens that
	// recent alone predicted cached on the chosen backend and of those the
	// backend had: their ratio is the odds that such a token is cached.
	recentHit, recentSeen float64

	last atomic.Pointer[learned]
}

func (l *learner) init(n int) {
	l.pooled = newSpeed()
	l.decode = newDecodeFit()
	l.slow.init(n, priorSlowness)
	l.decodeSlow.init(n, priorDecodeSlowness)
	l.capacity = make([]int, n)
	l.live = make([]bool, n)
	l.holdSum, l.holdWeight = priorHold, 1
	l.lifeSum, l.lifeN = priorHold, 1
	l.recentHit, l.recentSeen = priorRecent/2, priorRecent
	for i := range n {
		l.live[i] = true
	}
	l.publish()
}

// snapshot returns the latest learned values.
func (l *learner) snapshot() *learned { return l.last.Load() }

// slowRatios returns every backend's observed over predicted TTFT (float64
// bits), by backend index; read once per pick.
func (l *learner) slowRatios() []atomic.Uint64 { return l.slow.load() }

// decodeSlowRatios returns the same of the times between tokens.
func (l *learner) decodeSlowRatios() []atomic.Uint64 { return l.decodeSlow.load() }

// setBackends makes room for every backend of bs, starts the ones new to
// the learner at the prior, and forgets the learned slowness of those no
// longer in bs, whose indexes it returns.
func (l *learner) setBackends(bs []*fleet.Backend) (gone []int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(l.live)
	for _, b := range bs {
		n = max(n, b.Index+1)
	}
	if n > len(l.live) {
		l.slow.grow(n)
		l.decodeSlow.grow(n)
		for range n - len(l.live) {
			l.capacity = append(l.capacity, 0)
			l.live = append(l.live, false)
		}
	}
	want := make([]bool, n)
	for _, b := range bs {
		want[b.Index] = true
	}
	for i := range n {
		if want[i] == l.live[i] {
			continue
		}
		if !want[i] {
			gone = append(gone, i)
		}
		l.slow.set(i, want[i])
		l.decodeSlow.set(i, want[i])
		l.capacity[i] = 0
		l.live[i] = want[i]
	}
	l.publish()
	return gone
}

// publish makes the current sums the snapshot picks read. Call with mu held
// (or before the policy is shared).
func (l *learner) publish() {
	l.last.Store(&learned{
		speed:    l.pooled,
		decode:   l.decode,
		meanSlow: l.slow.mean(),
		hold:     l.holdSum / l.holdWeight,
		life:     l.lifeSum / l.lifeN,
		odds:     l.recentHit / l.recentSeen,

		decodeMix: l.decodeMix,
	})
}

// picked is what one kvroute decision needs to learn from its outcome: the
// request, where it went, what the two tiers predicted cached there, and the
// load it found.
type picked struct {
	policy      *Policy
	req         *router.Request
	backend     *fleet.Backend
	sure, maybe int              // tokens predicted cached by the index and by recent
	queued      int64            // prefill tokens queued there when routed (the router's count)
	decoding    int64            // requests decoding there when routed
	requests    int64            // requests in flight there when routed
	kv          int64            // context tokens they held (the router's count)
	work        float64          // seconds of prefill it was expected to cost there
	routed      float64          // the backend's prefill seconds ever routed, before it
	inverse     float64          // 1/its expected tokens, counted in the backend's until done
	x           [calDims]float64 // the calibration's features there when routed
}

// done is the Decision's Done: it learns each backend's TTFT model, the
// odds of recent's memory, how long KV is held, corrects the index's
// capacity for a backend whose cache held less than predicted, and forgets
// what a failed request was expected to leave in a backend's cache.
func (k *picked) done(o router.Outcome) {
	p, b := k.policy, k.backend
	stall := k.release()
	p.prune.settle(b)
	if o.Status == 0 || o.Status >= 500 {
		// The backend never computed the prompt: take back what Pick told
		// the index it would hold beyond what it held already.
		ratio := p.cfg.Tokens.Ratio()
		held := int(float64(k.sure) * ratio / float64(p.cfg.BlockBytes))
		maybe := held
		if k.maybe > k.sure {
			maybe = int(float64(k.maybe) * ratio / float64(p.cfg.BlockBytes))
		}
		hashes := k.req.PrefixHashes(nil, p.cfg.BlockBytes)
		p.index.Forget(b.Index, hashes, held)
		p.index.ForgetTier(recentTier, b.Index, hashes, maybe)
		return
	}
	if o.Status != 200 || o.PromptTokens <= 0 {
		return
	}
	p.outputs.observe(k.req, o.CompletionTokens)
	// Only a stream's first byte is its first token: a non-streamed
	// response's comes with its end.
	var ttft float64
	if o.Tokens > 0 {
		ttft = o.TTFT.Seconds()
	}
	p.cal.observe(b.Index, &k.x, ttft, k.sure, o.CachedTokens)
	l := &p.learner
	l.mu.Lock()
	defer l.mu.Unlock()
	k.learnDecode(l, o, stall)
	if k.maybe > k.sure && o.CachedTokens >= 0 {
		extra := float64(k.maybe - k.sure)
		l.recentHit = l.recentHit*recentDecay + clamp(float64(o.CachedTokens-k.sure), 0, extra)
		l.recentSeen = l.recentSeen*recentDecay + extra
	}
	if o.Latency > 0 {
		w := float64(o.PromptTokens + max(o.CompletionTokens, 0))
		l.holdSum = l.holdSum*holdDecay + w*o.Latency.Seconds()
		l.lifeSum = l.lifeSum*holdDecay + o.Latency.Seconds()
		l.lifeN = l.lifeN*holdDecay + 1
		l.holdWeight = l.holdWeight*holdDecay + w
	}
	// Speeds are learned only from requests that found no prefill waiting
	// on their backend (the router's exact count): their TTFT is their own
	// prefill. With a queue ahead, how much of it was still to do is itself
	// an estimate from the learned rate, and fitting the rate to it feeds
	// its errors back into it.
	// A backend removed from the fleet since the pick teaches the pooled
	// fit but keeps no slowness or capacity of its own.
	live := l.live[b.Index]
	if o.CachedTokens >= 0 && o.TTFT > 0 && k.queued == 0 {
		m, c := float64(o.PromptTokens-o.CachedTokens), float64(o.CachedTokens)
		decoding := float64(k.decoding)
		l.slow.observe(b.Index, o.TTFT.Seconds(), l.pooled.predict(m, c, decoding))
		l.pooled.observe(m, c, decoding, o.TTFT.Seconds())
	}
	l.publish()
	if live {
		p.resize(b, k.sure, o.CachedTokens)
	}
}

// resize sets the index's capacity for b: the KV the backend reports, in
// blocks of prompt text; shrunk when the backend had evicted what the index
// still believed cached (predicted tokens, of which it reported cached) —
// it serves other traffic, or its cache is smaller than it says — and
// regrown slowly when predictions hold. Call with the learner's mu held.
func (p *Policy) resize(b *fleet.Backend, predicted, cached int) {
	l := &p.learner
	full := p.blocksFor(p.cfg.DefaultKVTokens)
	if info := b.Info(); info != nil && info.KVTokens() > 0 {
		full = p.blocksFor(info.KVTokens())
	}
	c := l.capacity[b.Index]
	if c == 0 || c > full {
		c = full
	}
	blockTokens := int(float64(p.cfg.BlockBytes) / p.cfg.Tokens.Ratio())
	switch {
	case cached < 0:
	case cached+blockTokens < predicted:
		c = max(1, int(float64(c)*capacityShrink))
	case c < full:
		c = min(full, c+max(1, full/256))
	}
	if c != l.capacity[b.Index] {
		l.capacity[b.Index] = c
		p.index.SetCapacity(b.Index, c)
	}
	if p.index.TierCapacity(recentTier, b.Index) != recentFactor*full {
		p.index.SetTierCapacity(recentTier, b.Index, recentFactor*full)
	}
}
