package results

import (
	"math"
	"slices"

	"github.com/kvroute/kvroute/internal/prefix"
)

// CacheBounds computes, for the requests of a run (with recorded block
// hashes, see bench.Client.BlockTokens), the prompt-cache hit rates that bound
// every router on this workload: with an unlimited cache, and with one LRU
// cache of capacityBlocks blocks pooling the whole fleet and holding no
// block twice (a perfect router at the fleet's real capacity). Requests are
// taken in the order they were sent; each first looks its prompt up (the
// longest run of cached blocks from its start hits, as in vLLM), then
// leaves its whole sequence, reply included, in the cache.
func CacheBounds(results []Result, blockTokens, capacityBlocks int) Bounds {
	rs := make([]*Result, 0, len(results))
	var prompt float64
	for i := range results {
		r := &results[i]
		if r.Error == "" && r.SequenceBlocks != nil && r.PromptTokens > 0 {
			rs = append(rs, r)
			prompt += float64(r.PromptTokens)
		}
	}
	if prompt == 0 {
		return Bounds{}
	}
	slices.SortStableFunc(rs, func(a, b *Result) int { return int(a.Sent - b.Sent) })
	rate := func(capacity int) float64 {
		ix := prefix.New(1, capacity)
		matched := make([]int, 1)
		var hit float64
		for _, r := range rs {
			ix.Match(r.PromptBlocks, matched)
			// The engine recomputes the last block of a wholly cached prompt.
			hit += float64(min(matched[0]*blockTokens, r.PromptTokens-1))
			ix.Insert(0, r.SequenceBlocks)
		}
		return hit / prompt
	}
	return Bounds{Unlimited: rate(math.MaxInt32), Ideal: rate(capacityBlocks)}
}
