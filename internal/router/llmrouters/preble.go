package llmrouters

import (
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// PrebleE2 is the global scheduler of Preble (Srivatsa et al., "Preble:
// Efficient Distributed Prompt Scheduling for LLM Serving", ICLR 2025): E2,
// exploitation and exploration.
//
//   - Exploit: if the longest cached prefix of the prompt on any GPU is
//     longer than the rest of the prompt, send the request to a GPU holding
//     that prefix, the least loaded of them ("exploit").
//   - Explore: otherwise send it to the GPU with the lowest load + eviction
//     cost + prefill time of the prompt's tokens that GPU lacks ("explore").
//   - Rebalance: if the GPU so chosen carries more than Rebalance (1.5) times
//     the load of the lightest, and more than the lightest plus this request's
//     own load, send the request to the lightest instead ("rebalance").
//
// All three terms are times at a nominal 30,000 tokens/s, in seconds. A GPU's
// load is its in-flight work as the router counts it: queued prefill tokens
// plus the context tokens its decoding requests hold (Preble sums the
// prefill and decode time of the requests it sent in a recent window). The
// eviction cost is the recompute time of the tokens its cache would have to
// evict to fit the request's missing blocks (Preble also weighs each evicted
// node by its recent hits). The cache is an index of the prompts the policy
// routed to each GPU, in blocks of 64 bytes (16 tokens), bounded by each
// GPU's KV capacity, where Preble keeps a global radix tree of tokens.
// Preble's rebalance steers requests away from the heaviest GPU until the
// imbalance falls below its threshold; the extra condition that the gap
// exceed the request's own load keeps an idle fleet from bouncing a
// conversation off its cache because its previous turn is still running.
// Preble's prefix autoscaling (replicating a hot prefix) is left out: explore
// and rebalance already copy a hot prefix to more GPUs as the load needs.
type PrebleE2 struct {
	cfg   PrebleConfig
	rand  *router.Rand
	index *blockIndex
}

// PrebleConfig tunes preble-e2.
type PrebleConfig struct {
	// Rebalance is the load ratio between the chosen and the lightest GPU
	// above which the request goes to the lightest (default 1.5).
	Rebalance float64
}

// prebleRate is the nominal prefill rate that turns tokens into time: an
// H100 prefills about 30k tokens/s of an 8B model.
const prebleRate = 30_000.0

// NewPrebleE2 returns the policy for a fleet of backends, tuned by
// peers.Preble; seed 0 picks a random seed.
func NewPrebleE2(backends []*fleet.Backend, seed uint64, peers Config) *PrebleE2 {
	cfg := peers.Preble
	if cfg.Rebalance <= 0 {
		cfg.Rebalance = 1.5
	}
	return &PrebleE2{cfg: cfg, rand: router.NewRand(seed), index: newBlockIndex(backends, peers.kvTokens())}
}

// Name implements Policy.
func (*PrebleE2) Name() string { return "preble-e2" }

// prebleLoad is a GPU's load in seconds: its in-flight work.
func prebleLoad(l fleet.Load) float64 {
	return float64(l.PrefillTokens+l.DecodeTokens) / prebleRate
}

// Pick implements Policy.
func (p *PrebleE2) Pick(req *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	if len(cands) == 0 {
		return router.Decision{}, router.ErrNoBackend
	}
	s := p.index.get()
	defer p.index.put(s)
	p.index.match(s, req)
	prompt := promptTokens(req)

	loads := make([]fleet.Load, len(cands))
	work := make([]float64, len(cands))
	light, longest := -1, 0 // longest: on a candidate; the index also knows others
	lt := router.NewTies(p.rand)
	for i, b := range cands {
		longest = max(longest, p.index.matched(s, b))
		loads[i] = b.Load()
		work[i] = prebleLoad(loads[i])
		switch {
		case light < 0 || work[i] < work[light]:
			light = i
			lt.Reset(i)
		case work[i] == work[light]:
			lt.Add(i)
		}
	}
	light = lt.Best()

	scores := make([]router.Score, len(cands))
	best, reason := -1, ""
	t := router.NewTies(p.rand)
	cached := min(prompt, int(float64(longest)*peerBlockTokens))
	if longest > 0 && cached > prompt-cached {
		reason = "exploit"
		for i, b := range cands {
			scores[i] = router.Score{Backend: b.Name, Cost: work[i], Cached: p.index.cachedTokens(s, b, prompt)}
			if p.index.matched(s, b) != longest {
				continue
			}
			switch {
			case best < 0 || work[i] < work[best]:
				best = i
				t.Reset(i)
			case work[i] == work[best]:
				t.Add(i)
			}
		}
	} else {
		reason = "explore"
		for i, b := range cands {
			have := p.index.cachedTokens(s, b, prompt)
			missing := len(s.hashes) - p.index.matched(s, b)
			evict := max(0, p.index.held(b)+missing-p.index.capacityOf(b))
			cost := work[i] + float64(evict)*peerBlockTokens/prebleRate + float64(prompt-have)/prebleRate
			scores[i] = router.Score{Backend: b.Name, Cost: cost, Cached: have}
			switch {
			case best < 0 || cost < scores[best].Cost:
				best = i
				t.Reset(i)
			case cost == scores[best].Cost:
				t.Add(i)
			}
		}
	}
	best = t.Best()

	// What this request adds to the lightest GPU's load: its missing
	// prefill, then the context it holds while decoding.
	own := float64(prompt-scores[light].Cached+prompt+req.MaxTokens) / prebleRate
	if best != light && work[best] > p.cfg.Rebalance*work[light] && work[best]-work[light] > own {
		best, reason = light, "rebalance"
	}
	chosen := cands[best]
	p.index.insert(chosen, s.hashes)
	d := router.Decide(chosen, reason, scores[best].Cached)
	d.Scores = scores
	return d, nil
}

var _ router.FleetWatcher = (*PrebleE2)(nil)

// SetBackends implements FleetWatcher.
func (p *PrebleE2) SetBackends(backends []*fleet.Backend) { p.index.setBackends(backends) }
