package llmrouters

import (
	"slices"

	"github.com/kvroute/kvroute/internal/fleet"
)

// NewLLMDLoRA returns llm-d's scheduling profile for multi-adapter fleets:
// llmd-default's scorers plus the lora-affinity scorer (weight
// peers.LLMD.LoRAWeight, default 1, as llm-d's example configuration with
// prefix 3, queue 2 and KV cache 2 weighs it), named llmd-lora.
func NewLLMDLoRA(backends []*fleet.Backend, seed uint64, peers Config, metrics func(*fleet.Backend) *fleet.Metrics) *LLMDDefault {
	p := NewLLMDDefault(backends, seed, peers, metrics)
	p.loraWeight = p.cfg.LoRAWeight
	return p
}

// loraAffinity is llm-d's lora-affinity scorer for a request naming model
// on backend b, from b's scraped adapters (vllm:lora_requests_info):
//
//	1   the adapter is running there;
//	0.8 fewer adapters are running or waiting there (counted once each) than max_lora;
//	0.6 the adapter is waiting there;
//	0   otherwise, and when b reports no adapters.
func (p *LLMDDefault) loraAffinity(b *fleet.Backend, model string) float64 {
	var l *fleet.LoRAInfo
	if p.metrics != nil {
		if m := p.metrics(b); m != nil {
			l = m.LoRA
		}
	}
	if l == nil {
		return 0
	}
	union := len(l.Running)
	for _, w := range l.Waiting {
		if !slices.Contains(l.Running, w) {
			union++
		}
	}
	switch {
	case slices.Contains(l.Running, model):
		return 1
	case union < l.MaxLoRAs:
		return 0.8
	case slices.Contains(l.Waiting, model):
		return 0.6
	}
	return 0
}
