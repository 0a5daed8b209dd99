package kvevents

import (
	"fmt"
	"runtime"
	"testing"
)

var sinkInt int

// BenchmarkStoreMatch matches a 2,048-token prompt against every backend
// of a fleet whose engines each hold 1,000 blocks of their own and the
// prompt's first 64 blocks on one backend in ten: what kvroute's pick asks
// the store per request (MatchGPU, for every candidate at once).
func BenchmarkStoreMatch(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("backends=%d", n), func(b *testing.B) {
			s := NewStore(KeyTokens)
			prompt := make([]int32, 2048)
			for i := range prompt {
				prompt[i] = int32(i)
			}
			for be := range n {
				s.Reset(be, Exact)
				own := make([]int32, 16*1000)
				for i := range own {
					own[i] = int32(be*1_000_000 + i)
				}
				hashes := make([]uint64, 1000)
				for i := range hashes {
					hashes[i] = uint64(be)<<32 | uint64(i)
				}
				s.Apply(be, &Batch{Events: []Event{{Kind: BlockStored, Hashes: hashes, Tokens: own, BlockSize: 16, Medium: MediumGPU}}})
				if be%10 == 0 {
					ph := make([]uint64, 64)
					for i := range ph {
						ph[i] = uint64(be)<<32 | uint64(5000+i)
					}
					s.Apply(be, &Batch{Events: []Event{{Kind: BlockStored, Hashes: ph, Tokens: prompt[:64*16], BlockSize: 16, Medium: MediumGPU}}})
				}
			}
			keys := TokenChain(nil, prompt, 16)
			kf := func(int) []uint64 { return keys }
			idx := make([]int, n)
			for i := range idx {
				idx[i] = i
			}
			dst := make([]Matched, n)
			runtime.GC() // the setup's garbage, not the match's
			b.Run("fleet", func(b *testing.B) {
				b.ReportAllocs()
				for range b.N {
					s.MatchGPU(idx, kf, dst)
					sinkInt = dst[0].Blocks
				}
			})
			runtime.GC()
			b.Run("per-backend", func(b *testing.B) {
				b.ReportAllocs()
				for range b.N {
					for be := range n {
						_, _, gpu, _ := s.Match(be, kf)
						sinkInt += gpu
					}
				}
			})
		})
	}
}

// BenchmarkTokenChain hashes a 2,048-token prompt into 16-token blocks.
// BenchmarkTokenChain hashes a 2,048-token prompt into its chain: in
// vLLM's 16-token blocks, and in SGLang's default pages of one token.
func BenchmarkTokenChain(b *testing.B) {
	prompt := make([]int32, 2048)
	for _, bs := range []int{16, 1} {
		b.Run(fmt.Sprintf("block=%d", bs), func(b *testing.B) {
			var dst []uint64
			b.ReportAllocs()
			for range b.N {
				dst = TokenChain(dst[:0], prompt, bs)
			}
			sinkInt = len(dst)
		})
	}
}
