// Package llmrouters holds the policies of other LLM routers (SGLang's
// router, NVIDIA Dynamo, llm-d, Preble), reimplemented from their published
// descriptions, so that every benchmark can show kvroute beside them on the
// same fleet and workload (DESIGN §5). The package is not called peers:
// internal/peers is kvroute's own router replicas, and the code calls these
// policies "the peers" only in that older sense of rival routers.
//
// Each policy is a small struct, safe for concurrent use, deterministic
// given its seed. None of them learns from outcomes: the peers' approximate
// modes learn only from their own routing decisions, and the router's
// in-flight counts already release a request's load when it ends.
package llmrouters

import (
	"math"

	"github.com/kvroute/kvroute/internal/router"
)

// Compile-time checks that the peers are policies.
var (
	_ router.Policy = (*SGLangCacheAware)(nil)
	_ router.Policy = (*DynamoKV)(nil)
	_ router.Policy = (*LLMDDefault)(nil)
	_ router.Policy = (*PrebleE2)(nil)
)

// Config tunes the policies reimplemented from other routers. Zero values
// take the defaults.
type Config struct {
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
	peerBlockTokens     = peerBlockBytes / router.DefaultRatio
	peerDefaultKVTokens = 400_000
)

func (c Config) kvTokens() int {
	if c.DefaultKVTokens > 0 {
		return c.DefaultKVTokens
	}
	return peerDefaultKVTokens
}

// promptTokens estimates a prompt's length in tokens at DefaultRatio bytes a
// token (the peers do not tokenize either), unless the caller knows it.
func promptTokens(req *router.Request) int { return req.PromptTokensAt(router.DefaultRatio) }

func clamp(x, lo, hi float64) float64 { return math.Max(lo, math.Min(hi, x)) }
