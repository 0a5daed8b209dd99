package hashtab

import (
	"math/rand/v2"
	"testing"
)

// A Chains finds exactly what a map from hash to value finds, under random
// sequences that share prefixes and differ inside groups (the spill path),
// inserted and removed in random order.
func TestChainsIsAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	ch := NewChains(64)
	want := map[uint64]int32{}
	where := map[uint64]int32{} // hash → at
	var seqs [][]uint64
	for range 40 {
		// A sequence shares a random prefix of an earlier one, then goes
		// its own way, often inside a group: with five contents a block,
		// sequences also meet again by chance.
		var s []uint64
		if len(seqs) > 0 && rng.IntN(3) > 0 {
			p := seqs[rng.IntN(len(seqs))]
			s = append(s, p[:rng.IntN(len(p))]...)
		}
		for len(s) < 10+rng.IntN(60) {
			s = append(s, chain(s, rng.Uint64()%5))
		}
		seqs = append(seqs, s)
	}
	next := int32(0)
	for op := range 20_000 {
		s := seqs[rng.IntN(len(seqs))]
		i := rng.IntN(len(s))
		cur := NewCursor()
		h := s[i]
		if rng.IntN(2) == 0 {
			at := ch.Insert(&cur, s, i, next)
			_, had := want[h]
			if (at != Absent) == had {
				t.Fatalf("op %d: Insert of a hash present=%v returned %d", op, had, at)
			}
			if at != Absent {
				want[h], where[h] = next, at
				next++
			}
		} else if at, ok := where[h]; ok {
			ch.Remove(at, h)
			delete(want, h)
			delete(where, h)
		}
		for _, s := range seqs[:5] {
			cur := NewCursor()
			for i, h := range s {
				w, wok := want[h]
				if got, ok := ch.Get(&cur, s, i); ok != wok || got != w && ok {
					t.Fatalf("op %d: Get(block %d) = %d, %v, want %d, %v", op, i, got, ok, w, wok)
				}
			}
		}
		if ch.Len() != len(want) {
			t.Fatalf("op %d: Len %d, want %d", op, ch.Len(), len(want))
		}
	}
	if ch.spill.Len() == 0 {
		t.Error("nothing spilled: the test does not reach that path")
	}
}

// chain is the hash of a block of content c after the blocks s: a mix
// of both, so that, as with real chained hashes, a hash names its prefix.
func chain(s []uint64, c uint64) uint64 {
	var parent uint64 = 1
	if len(s) > 0 {
		parent = s[len(s)-1]
	}
	x := parent*0x9e3779b97f4a7c15 + c + 1
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	return x ^ x>>33
}
