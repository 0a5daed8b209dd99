package policies

import (
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/routertest"
)

var sinkDecision router.Decision

// BenchmarkPick measures one routing decision, prompt hashing included, for
// a 32k-token prompt (128 KiB of text) whose first half is cached on one
// backend, over fleets of 16 and 1,000 backends (kvroute:ttft: kvroute
// without pricing the stream).
func BenchmarkPick(b *testing.B) {
	for _, n := range []int{16, 1000} {
		for _, policy := range append(Names(), "kvroute:ttft") {
			b.Run(fmt.Sprintf("%s/backends=%d", policy, n), func(b *testing.B) {
				bs := routertest.Backends(n)
				p, err := New(policy, bs, Options{Seed: 1})
				if err != nil {
					b.Fatal(err)
				}
				prompt := routertest.Words(1, 128<<10)
				if _, err := p.Policy().Pick(&router.Request{Prompt: prompt[:64<<10]}, bs); err != nil {
					b.Fatal(err)
				}
				// Keep the index warm with other prompts on every backend.
				for i := range n {
					if _, err := p.Policy().Pick(&router.Request{Prompt: routertest.Words(i+2, 8<<10)}, bs); err != nil {
						b.Fatal(err)
					}
				}
				req := &router.Request{Prompt: prompt, SessionKey: "s", MaxTokens: 100}
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					sinkDecision, err = p.Policy().Pick(req, bs)
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
