package llmrouters

import (
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// LLMDDefault is the default scheduling profile of the llm-d inference
// scheduler: every candidate gets a weighted sum of scorers, each in [0, 1],
//
//	queue-scorer (weight 2): (max − waiting) / (max − min) over the candidates, 1 when all are equal;
//	kv-cache-utilization-scorer (weight 2): 1 − KV cache usage;
//	prefix-cache-scorer (weight 3): matched prompt blocks / prompt blocks;
//
// and the highest sum wins, ties broken at random ("prefix" when the winner
// holds part of the prompt, "score" when not). Decision.Scores carries the
// negated sums as costs.
//
// Waiting requests and KV usage come from the scraped metrics when the
// policies.Options.Metrics hook gives fresh ones; otherwise from the router's own
// counts: requests routed and not yet past their first token, and the KV the
// in-flight requests hold over the backend's KV capacity. The prefix index is
// llm-d's approximate one: the prompts this policy routed to each backend, in
// blocks of 64 bytes (about 16 tokens), bounded by its KV capacity.
type LLMDDefault struct {
	cfg     LLMDConfig
	rand    *router.Rand
	index   *blockIndex
	metrics func(*fleet.Backend) *fleet.Metrics
	// loraWeight weighs the lora-affinity scorer (llmd-lora, lora.go);
	// 0 in llmd-default, which has none.
	loraWeight float64
}

// LLMDConfig tunes llmd-default: the scorers' weights. Zero values take the
// defaults (2, 2, 3); negative means 0.
type LLMDConfig struct {
	QueueWeight, KVCacheWeight, PrefixWeight float64
	// LoRAWeight weighs llmd-lora's lora-affinity scorer (default 1).
	LoRAWeight float64
}

func (c LLMDConfig) withDefaults() LLMDConfig {
	def := func(w, d float64) float64 {
		switch {
		case w == 0:
			return d
		case w < 0:
			return 0
		}
		return w
	}
	c.QueueWeight = def(c.QueueWeight, 2)
	c.KVCacheWeight = def(c.KVCacheWeight, 2)
	c.PrefixWeight = def(c.PrefixWeight, 3)
	c.LoRAWeight = def(c.LoRAWeight, 1)
	return c
}

// NewLLMDDefault returns the policy for a fleet of backends, tuned by
// peers.LLMD and reading scraped metrics through metrics (nil: none; see
// policies.Options.Metrics); seed 0 picks a random seed.
func NewLLMDDefault(backends []*fleet.Backend, seed uint64, peers Config, metrics func(*fleet.Backend) *fleet.Metrics) *LLMDDefault {
	return &LLMDDefault{
		cfg:     peers.LLMD.withDefaults(),
		rand:    router.NewRand(seed),
		index:   newBlockIndex(backends, peers.kvTokens()),
		metrics: metrics,
	}
}

// Name implements Policy.
func (p *LLMDDefault) Name() string {
	if p.loraWeight > 0 {
		return "llmd-lora"
	}
	return "llmd-default"
}

// llmdSignals are one candidate's inputs to the scorers.
type llmdSignals struct {
	load    fleet.Load
	waiting float64
	kvFree  float64 // 1 − usage, in [0, 1]
}

// signals reads b's waiting queue and free KV fraction, from fresh scraped
// metrics if there are any, else from the router's counts.
func (p *LLMDDefault) signals(b *fleet.Backend, kvBlocks int) llmdSignals {
	s := llmdSignals{load: b.Load()}
	var m *fleet.Metrics
	if p.metrics != nil {
		m = p.metrics(b)
	}
	if m != nil {
		s.waiting = m.Waiting
	} else {
		s.waiting = float64(s.load.Requests - s.load.Decoding)
	}
	if m != nil && m.KVUsage >= 0 {
		s.kvFree = 1 - clamp(m.KVUsage, 0, 1)
	} else {
		s.kvFree = 1 - clamp(float64(s.load.DecodeTokens)/(float64(kvBlocks)*peerBlockTokens), 0, 1)
	}
	return s
}

// Pick implements Policy.
func (p *LLMDDefault) Pick(req *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	if len(cands) == 0 {
		return router.Decision{}, router.ErrNoBackend
	}
	s := p.index.get()
	defer p.index.put(s)
	p.index.match(s, req)
	prompt := promptTokens(req)

	sig := make([]llmdSignals, len(cands))
	lo, hi := 0.0, 0.0
	for i, b := range cands {
		sig[i] = p.signals(b, p.index.capacityOf(b))
		if i == 0 || sig[i].waiting < lo {
			lo = sig[i].waiting
		}
		if i == 0 || sig[i].waiting > hi {
			hi = sig[i].waiting
		}
	}
	scores := make([]router.Score, len(cands))
	best := -1
	t := router.NewTies(p.rand)
	for i, b := range cands {
		queue := 1.0
		if hi > lo {
			queue = (hi - sig[i].waiting) / (hi - lo)
		}
		prefixScore := 0.0
		if len(s.hashes) > 0 {
			prefixScore = float64(p.index.matched(s, b)) / float64(len(s.hashes))
		}
		total := p.cfg.QueueWeight*queue + p.cfg.KVCacheWeight*sig[i].kvFree + p.cfg.PrefixWeight*prefixScore +
			p.loraWeight*p.loraAffinity(b, req.Model)
		scores[i] = router.Score{Backend: b.Name, Cost: -total, Cached: p.index.cachedTokens(s, b, prompt)}
		switch {
		case best < 0 || scores[i].Cost < scores[best].Cost:
			best = i
			t.Reset(i)
		case scores[i].Cost == scores[best].Cost:
			t.Add(i)
		}
	}
	best = t.Best()
	chosen := cands[best]
	p.index.insert(chosen, s.hashes)
	reason := "score"
	if scores[best].Cached > 0 {
		reason = "prefix"
	}
	d := router.Decide(chosen, reason, scores[best].Cached)
	d.Scores = scores
	return d, nil
}

var _ router.FleetWatcher = (*LLMDDefault)(nil)

// SetBackends implements FleetWatcher.
func (p *LLMDDefault) SetBackends(backends []*fleet.Backend) { p.index.setBackends(backends) }
