package llmrouters

import (
	"math"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// DynamoKV is the KV router of NVIDIA Dynamo. For every worker it computes,
// in KV blocks of 16 tokens,
//
//	cost = OverlapWeight × prefill blocks + decode blocks,
//	prefill blocks = the request's uncached prompt blocks there + the worker's queued prefill blocks,
//	decode blocks  = the worker's active blocks + the request's prompt blocks,
//
// and takes the lowest cost, breaking ties by fewest active blocks, then at
// random ("prefix" if the worker holds part of the prompt, "least-cost" if
// not). With Temperature > 0 it instead samples softmax(−normalised cost /
// Temperature), the costs min-max normalised to [0, 1] as Dynamo does.
//
// Dynamo learns which blocks a worker caches from the engine's KV events;
// like Dynamo without them (ApproxKvIndexer) this policy records the prompt
// blocks it routed to each worker, in blocks of 64 bytes of the rendered
// prompt, bounded by the worker's KV capacity (least recently used forgotten
// first) where Dynamo expires them after 120 s. Queued prefill and active
// blocks are the router's own in-flight token counts divided by 16.
type DynamoKV struct {
	cfg   DynamoConfig
	rand  *router.Rand
	index *blockIndex
}

// DynamoConfig tunes dynamo-kv.
type DynamoConfig struct {
	// OverlapWeight weighs prefill blocks against decode blocks: higher
	// favours cache reuse (TTFT), lower even load (ITL). Default 1; negative
	// means 0 (pure load balancing).
	OverlapWeight float64
	// Temperature > 0 samples the worker from softmax(−normalised cost /
	// Temperature) instead of taking the cheapest. Default 0.
	Temperature float64
}

// NewDynamoKV returns the policy for a fleet of backends, tuned by
// peers.Dynamo; seed 0 picks a random seed.
func NewDynamoKV(backends []*fleet.Backend, seed uint64, peers Config) *DynamoKV {
	cfg := peers.Dynamo
	switch {
	case cfg.OverlapWeight == 0:
		cfg.OverlapWeight = 1
	case cfg.OverlapWeight < 0:
		cfg.OverlapWeight = 0
	}
	cfg.Temperature = max(cfg.Temperature, 0)
	return &DynamoKV{cfg: cfg, rand: router.NewRand(seed), index: newBlockIndex(backends, peers.kvTokens())}
}

// Name implements Policy.
func (*DynamoKV) Name() string { return "dynamo-kv" }

// Pick implements Policy.
func (p *DynamoKV) Pick(req *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	if len(cands) == 0 {
		return router.Decision{}, router.ErrNoBackend
	}
	s := p.index.get()
	defer p.index.put(s)
	p.index.match(s, req)
	prompt := promptTokens(req)

	scores := make([]router.Score, len(cands))
	loads := make([]fleet.Load, len(cands))
	best := -1
	t := router.NewTies(p.rand)
	for i, b := range cands {
		loads[i] = b.Load()
		cached := p.index.cachedTokens(s, b, prompt)
		prefill := float64(prompt-cached)/peerBlockTokens + float64(loads[i].PrefillTokens)/peerBlockTokens
		decode := float64(loads[i].DecodeTokens)/peerBlockTokens + float64(prompt)/peerBlockTokens
		scores[i] = router.Score{Backend: b.Name, Cost: p.cfg.OverlapWeight*prefill + decode, Cached: cached}
		switch {
		case best < 0 || scores[i].Cost < scores[best].Cost ||
			scores[i].Cost == scores[best].Cost && loads[i].DecodeTokens < loads[best].DecodeTokens:
			best = i
			t.Reset(i)
		case scores[i].Cost == scores[best].Cost && loads[i].DecodeTokens == loads[best].DecodeTokens:
			t.Add(i)
		}
	}
	best = t.Best()
	if p.cfg.Temperature > 0 {
		best = softmaxSample(scores, p.cfg.Temperature, p.rand)
	}
	chosen := cands[best]
	p.index.insert(chosen, s.hashes)
	reason := "least-cost"
	if scores[best].Cached > 0 {
		reason = "prefix"
	}
	d := router.Decide(chosen, reason, scores[best].Cached)
	d.Scores = scores
	return d, nil
}

// softmaxSample draws a candidate with probability ∝ exp(−c/temp), c the
// cost min-max normalised to [0, 1] (all equal: uniform).
func softmaxSample(scores []router.Score, temp float64, r *router.Rand) int {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range scores {
		lo, hi = math.Min(lo, s.Cost), math.Max(hi, s.Cost)
	}
	if !(hi > lo) {
		return r.IntN(len(scores))
	}
	weight := func(c float64) float64 { return math.Exp(-(c - lo) / (hi - lo) / temp) }
	var sum float64
	for _, s := range scores {
		sum += weight(s.Cost)
	}
	u := r.Float64() * sum
	for i, s := range scores {
		u -= weight(s.Cost)
		if u < 0 {
			return i
		}
	}
	return len(scores) - 1
}

var _ router.FleetWatcher = (*DynamoKV)(nil)

// SetBackends implements FleetWatcher.
func (p *DynamoKV) SetBackends(backends []*fleet.Backend) { p.index.setBackends(backends) }
