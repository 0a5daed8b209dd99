package kvroute

import (
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/routertest"
)

// sinkDecision keeps the benchmarks' decisions alive.
var sinkDecision router.Decision

// BenchmarkPickScale measures kvroute's decision over fleets of 100, 1,000
// and 10,000 backends whose prefix index is full (every backend holds as
// many blocks as its capacity, all of them starting with a system prompt
// every backend holds) and half of which have requests in flight: pruned
// (the default) and scanning every backend (FullScan), on the same index.
// The request is a 4k-token prompt (16 KiB) whose first half one backend
// holds.
func BenchmarkPickScale(b *testing.B) {
	for _, n := range []int{100, 1000, 10_000} {
		bs := routertest.Backends(n)
		for i, bk := range bs {
			for range i % 2 * (1 + i%3) {
				bk.Start(1000, 5000)
			}
		}
		// 32k tokens of KV a backend: 500 blocks of index, 1,000 in the
		// recent tier.
		p := New(bs, Config{Seed: 1, DefaultKVTokens: 32_000})
		fillIndex(p, n)
		prompt := routertest.Words(1, 16<<10)
		p.index.Insert(n/2, prefixHashesOf(prompt[:8<<10], p.cfg.BlockBytes))
		req := &router.Request{Prompt: prompt, SessionKey: "s", MaxTokens: 100}
		for _, full := range []bool{false, true} {
			name := "kvroute"
			if full {
				name = "kvroute-full-scan"
			}
			b.Run(fmt.Sprintf("%s/backends=%d", name, n), func(b *testing.B) {
				p.cfg.FullScan = full
				b.ReportAllocs()
				for b.Loop() {
					d, err := p.Pick(req, bs)
					if err != nil {
						b.Fatal(err)
					}
					sinkDecision = d
				}
			})
		}
	}
}

// fillIndex fills every backend's index to its capacities with 8 KiB
// prompts that share a 2 KiB system prompt.
func fillIndex(p *Policy, n int) {
	system := routertest.Words(0, 2<<10)
	blocks := p.index.TierCapacity(recentTier, 0)
	for i := range n {
		for k := 0; k*(8<<10)/p.cfg.BlockBytes < blocks; k++ {
			p.index.Insert(i, prefixHashesOf(system+routertest.Words(n*k+i+2, 6<<10), p.cfg.BlockBytes))
		}
	}
}

func prefixHashesOf(prompt string, blockBytes int) []uint64 {
	return (&router.Request{Prompt: prompt}).PrefixHashes(nil, blockBytes)
}
