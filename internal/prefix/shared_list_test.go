package prefix

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// The index with one list per backend for both tiers does what the one
// with a list per tier did (refIndex, reference_test.go), operation for
// operation: the same matches, the same backends from MatchFew in the same
// order, and every block with the same holders in the same order. Blocks
// are shared by many backends (so they turn hot and cold), tiers are
// forgotten and shrunk independently (so one tier's entries are not always
// a part of the other's), and backends are cleared and added.
func TestSharedListMatchesTwoLists(t *testing.T) {
	for _, caps := range [][]int{{30}, {30, 60}, {40, 20}} {
		t.Run(fmt.Sprint(caps), func(t *testing.T) {
			const backends = 40
			rng := rand.New(rand.NewPCG(3, uint64(caps[0])))
			ix, ref := NewTiered(backends, caps...), newRefTiered(backends, caps...)
			n := backends
			prompt := func() []uint64 {
				hs := make([]uint64, 1+rng.IntN(16))
				for i := range hs {
					// Few heads, many tails: hot first blocks.
					hs[i] = uint64(rng.IntN(1+i*i*8))*1000 + uint64(i)
				}
				return hs
			}
			for op := range 60_000 {
				b, k := rng.IntN(n), rng.IntN(len(caps))
				switch r := rng.IntN(100); {
				case r < 70:
					hs := prompt()
					ix.Insert(b, hs)
					ref.Insert(b, hs)
				case r < 85:
					hs := prompt()
					from := rng.IntN(len(hs) + 1)
					ix.ForgetTier(k, b, hs, from)
					ref.ForgetTier(k, b, hs, from)
				case r < 95:
					c := 1 + rng.IntN(70)
					ix.SetTierCapacity(k, b, c)
					ref.SetTierCapacity(k, b, c)
				case r < 97:
					ix.Clear(b)
					ref.Clear(b)
				default:
					if n < backends+8 {
						n++
						ix.Grow(n)
						ref.Grow(n)
					}
				}
				if op%5 == 0 {
					compareMatches(t, op, ix, ref, prompt(), n, len(caps))
				}
				if op%1000 == 0 {
					compareHolders(t, op, ix, ref)
				}
			}
			compareHolders(t, -1, ix, ref)
			if ix.held.Len() == 0 {
				t.Error("no block ever became hot")
			}
		})
	}
}

func compareMatches(t *testing.T, op int, ix *Index, ref *refIndex, hs []uint64, n, tiers int) {
	t.Helper()
	got, want := make([][]int, tiers), make([][]int, tiers)
	for k := range tiers {
		got[k], want[k] = make([]int, n), make([]int, n)
	}
	if g, w := ix.Match(hs, got...), ref.Match(hs, want...); g != w || !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("op %d: Match %d %v, want %d %v", op, g, got, w, want)
	}
	asked := []int32{int32(op % n)}
	gb, gl := ix.MatchFew(hs, slices.Clone(asked), 4, got...)
	wb, wl := ref.MatchFew(hs, slices.Clone(asked), 4, want...)
	if gl != wl || !slices.Equal(gb, wb) || !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("op %d: MatchFew %v %d, want %v %d", op, gb, gl, wb, wl)
	}
	for b := range n {
		for k := range tiers {
			if g, w := ix.tiers[k][b].size, ref.tiers[k][b].size; g != w {
				t.Fatalf("op %d: backend %d tier %d holds %d, want %d", op, b, k, g, w)
			}
		}
	}
}

// compareHolders checks that every block has the same holders, in order,
// in both indexes, and that each holder's entry names its block.
func compareHolders(t *testing.T, op int, ix *Index, ref *refIndex) {
	t.Helper()
	if ix.byHash.Len() != ref.byHash.Len() {
		t.Fatalf("op %d: %d blocks, want %d", op, ix.byHash.Len(), ref.byHash.Len())
	}
	for bi := range ref.blocks {
		h := ref.blocks[bi].hash
		rbi, ok := ref.byHash.Get(h)
		if !ok || rbi != int32(bi) {
			continue
		}
		gbi, ok := ix.byHash.Get(h)
		if !ok {
			t.Fatalf("op %d: block %x missing", op, h)
		}
		want, got := ref.holders(rbi), ix.holders(gbi)
		if len(got) != len(want) {
			t.Fatalf("op %d: block %x has %d holders, want %d", op, h, len(got), len(want))
		}
		for i, hd := range got {
			if hd.backend != want[i].backend || hd.tier != want[i].tier {
				t.Fatalf("op %d: block %x holder %d is %d/%d, want %d/%d", op, h, i, hd.backend, hd.tier, want[i].backend, want[i].tier)
			}
			nd := ix.lists[hd.backend].nodes[hd.node]
			if nd.b != gbi || nd.slot[hd.tier] != int32(i) {
				t.Fatalf("op %d: block %x holder %d: entry names block %d slot %d", op, h, i, nd.b, nd.slot[hd.tier])
			}
		}
	}
}

// BenchmarkInsertFullTwoLists is BenchmarkInsertFull on the index as it
// was, with a list per tier (refIndex), to compare in one run.
func BenchmarkInsertFullTwoLists(b *testing.B) {
	benchInsertFull(b, newRefTiered(insertFullBackends, insertFullCapacity, 2*insertFullCapacity))
}
