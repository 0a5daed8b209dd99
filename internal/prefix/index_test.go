package prefix

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func text(seed byte, n int) string {
	var sb strings.Builder
	for i := range n {
		sb.WriteByte('a' + (seed+byte(i*7)+byte(i/26))%26)
	}
	return sb.String()
}

func TestHashChains(t *testing.T) {
	a := Hash(nil, text(1, 40), 16)
	b := Hash(nil, text(1, 32)+text(9, 8), 16)
	if len(a) != 2 || len(b) != 2 || a[0] != b[0] || a[1] != b[1] {
		t.Fatalf("equal full blocks must hash equal: %x %x", a, b)
	}
	c := Hash(nil, "X"+text(1, 40)[1:], 16)
	if c[1] == a[1] {
		t.Error("block 2 after a different block 1 must hash differently")
	}
	if got := Hash(nil, text(1, 15), 16); len(got) != 0 {
		t.Errorf("a partial block got a hash: %x", got)
	}
}

func TestMatchPerBackend(t *testing.T) {
	ix := New(3, 100)
	long := Hash(nil, text(1, 10*16), 16)
	ix.Insert(0, long[:6])
	ix.Insert(1, long[:3])
	ix.Insert(2, Hash(nil, text(2, 4*16), 16))
	matched := make([]int, 3)
	if got := ix.Match(long, matched); got != 6 {
		t.Errorf("longest = %d, want 6", got)
	}
	if matched[0] != 6 || matched[1] != 3 || matched[2] != 0 {
		t.Errorf("matched = %v, want [6 3 0]", matched)
	}
	// A hole in a backend's blocks ends its match there.
	ix.Forget(0, long, 2)
	ix.Insert(0, long[4:5])
	if ix.Match(long, matched); matched[0] != 2 {
		t.Errorf("after forgetting block 2 on: matched[0] = %d, want 2", matched[0])
	}
}

func TestLRUBoundsEachBackend(t *testing.T) {
	ix := New(2, 8)
	a := Hash(nil, text(1, 4*16), 16)
	b := Hash(nil, text(2, 4*16), 16)
	c := Hash(nil, text(3, 4*16), 16)
	matched := make([]int, 2)
	ix.Insert(0, a)
	ix.Insert(0, b)
	ix.Insert(0, a) // a is now more recent than b
	ix.Insert(0, c) // evicts b's 4 blocks, tail first
	if ix.Match(a, matched); matched[0] != 4 {
		t.Errorf("a: matched %d, want 4", matched[0])
	}
	if ix.Match(b, matched); matched[0] != 0 {
		t.Errorf("b: matched %d, want 0 (least recently used)", matched[0])
	}
	if ix.Len(0) != 8 || ix.Len(1) != 0 {
		t.Errorf("sizes %d, %d; want 8, 0", ix.Len(0), ix.Len(1))
	}
	// Evicting the tail first keeps a prompt's head: shrink to 6 blocks.
	ix.SetCapacity(0, 6)
	if ix.Match(c, matched); matched[0] != 4 {
		t.Errorf("c after shrink: matched %d, want 4", matched[0])
	}
	if ix.Match(a, matched); matched[0] != 2 {
		t.Errorf("a after shrink: matched %d, want its first 2 blocks", matched[0])
	}
	// A block held by two backends survives one forgetting it.
	ix.Insert(1, c)
	ix.Forget(0, c, 0)
	if ix.Match(c, matched); matched[0] != 0 || matched[1] != 4 {
		t.Errorf("c after backend 0 forgot it: matched %v, want [0 4]", matched)
	}
}

var sinkHashes []uint64

func BenchmarkHash(b *testing.B) {
	prompt := text(1, 128<<10) // about 32k tokens
	b.SetBytes(int64(len(prompt)))
	b.ReportAllocs()
	buf := make([]uint64, 0, len(prompt)/DefaultBlockBytes)
	for b.Loop() {
		sinkHashes = Hash(buf[:0], prompt, DefaultBlockBytes)
	}
}

// The index agrees with a plain model of it (per tier and backend, a list
// of hashes, most recently used first, cut to the capacity) under random
// insertions, forgetting and capacity changes, while blocks are forgotten
// and reused, with one tier and with two over the same blocks.
func TestIndexMatchesModel(t *testing.T) {
	for _, caps := range [][]int{{30}, {30, 60}} {
		const backends = 4
		rng := rand.New(rand.NewPCG(8, uint64(len(caps))))
		ix := NewTiered(backends, caps...)
		tiers := len(caps)
		model := make([][][]uint64, tiers)
		capacity := make([][]int, tiers)
		for k := range tiers {
			model[k] = make([][]uint64, backends)
			capacity[k] = make([]int, backends)
			for b := range backends {
				capacity[k][b] = caps[k]
			}
		}
		drop := func(k, b int, h uint64) {
			for i, x := range model[k][b] {
				if x == h {
					model[k][b] = append(model[k][b][:i], model[k][b][i+1:]...)
					return
				}
			}
		}
		prompt := func() []uint64 {
			hs := make([]uint64, 1+rng.IntN(12))
			for i := range hs {
				hs[i] = uint64(rng.IntN(60))*1000 + uint64(i) // a few shared heads
			}
			return hs
		}
		matched := make([][]int, tiers)
		for k := range matched {
			matched[k] = make([]int, backends)
		}
		for op := range 20_000 {
			b, k := rng.IntN(backends), rng.IntN(tiers)
			switch r := rng.IntN(10); {
			case r < 6:
				hs := prompt()
				ix.Insert(b, hs)
				for k := range tiers {
					for i := len(hs) - 1; i >= 0; i-- {
						drop(k, b, hs[i])
						model[k][b] = append([]uint64{hs[i]}, model[k][b]...)
					}
					model[k][b] = model[k][b][:min(len(model[k][b]), capacity[k][b])]
				}
			case r < 7:
				hs := prompt()
				from := rng.IntN(len(hs))
				ix.ForgetTier(k, b, hs, from)
				for _, h := range hs[from:] {
					drop(k, b, h)
				}
			case r < 8:
				capacity[k][b] = 1 + rng.IntN(40)
				ix.SetTierCapacity(k, b, capacity[k][b])
				model[k][b] = model[k][b][:min(len(model[k][b]), capacity[k][b])]
			default:
				hs := prompt()
				longest := ix.Match(hs, matched...)
				want := 0
				for k := range tiers {
					for c := range backends {
						n := 0
						for n < len(hs) && slices.Contains(model[k][c], hs[n]) {
							n++
						}
						if matched[k][c] != n {
							t.Fatalf("%d tiers, op %d: tier %d backend %d matched %d blocks, want %d", tiers, op, k, c, matched[k][c], n)
						}
						if k == 0 {
							want = max(want, n)
						}
					}
				}
				if longest != want {
					t.Fatalf("%d tiers, op %d: longest %d, want %d", tiers, op, longest, want)
				}
			}
			for k := range tiers {
				for c := range backends {
					if got := ix.tiers[k][c].size; got != len(model[k][c]) {
						t.Fatalf("%d tiers, op %d: tier %d backend %d holds %d blocks, want %d", tiers, op, k, c, got, len(model[k][c]))
					}
				}
			}
		}
	}
}

func TestGrowAndClear(t *testing.T) {
	ix := NewTiered(2, 4, 8)
	a := Hash(nil, strings.Repeat("a", 64), 16)
	ix.Insert(0, a)
	ix.Insert(1, a)
	ix.Grow(3)
	if n := ix.Backends(); n != 3 {
		t.Fatalf("Backends after Grow(3) = %d", n)
	}
	if c := ix.TierCapacity(1, 2); c != 8 {
		t.Errorf("new backend's tier 1 capacity = %d, want 8", c)
	}
	ix.Insert(2, a)
	short := make([]int, 2) // made before Grow: backend 2 is ignored, not a panic
	if got := ix.Match(a, short); got != 4 || short[0] != 4 {
		t.Errorf("Match with a short slice = %d, %v", got, short)
	}
	ix.Clear(0)
	m0, m1 := make([]int, 3), make([]int, 3)
	ix.Match(a, m0, m1)
	if want := []int{0, 4, 4}; !slices.Equal(m0, want) || !slices.Equal(m1, want) {
		t.Errorf("after Clear(0): tier 0 %v, tier 1 %v, want %v in both", m0, m1, want)
	}
	if ix.Len(0) != 0 {
		t.Errorf("Len(0) after Clear = %d", ix.Len(0))
	}
	ix.Clear(1)
	ix.Clear(2)
	ix.Clear(7) // out of range: nothing
	if got := ix.Match(a, m0); got != 0 {
		t.Errorf("Match after clearing every backend = %d", got)
	}
	ix.Insert(0, a) // a cleared backend can be used again
	if got := ix.Match(a, m0); got != 4 {
		t.Errorf("Match after re-insert = %d, want 4", got)
	}
}

// BenchmarkInsertFull inserts prompts of 24 blocks, a shared first one and
// 23 of their own, into a two-tier index of 1,000 backends that is full:
// every insertion evicts in both tiers, as kvroute's index does on a
// thousand-server Mooncake simulation.
func BenchmarkInsertFull(b *testing.B) {
	benchInsertFull(b, NewTiered(insertFullBackends, insertFullCapacity, 2*insertFullCapacity))
}

const insertFullBackends, insertFullCapacity = 1000, 1000

// benchInsertFull fills ix, then times one insertion of 24 blocks.
func benchInsertFull(b *testing.B, ix interface{ Insert(int, []uint64) }) {
	const blocks = 24
	rng := rand.New(rand.NewPCG(1, 2))
	prompt := make([]uint64, blocks)
	insert := func() {
		prompt[0] = 1
		for i := 1; i < blocks; i++ {
			prompt[i] = rng.Uint64()
		}
		ix.Insert(rng.IntN(insertFullBackends), prompt)
	}
	for range insertFullBackends * 2 * insertFullCapacity / blocks * 3 / 2 {
		insert()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		insert()
	}
}
