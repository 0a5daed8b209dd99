package engine

import (
	"math/rand/v2"
	"testing"
)

// A groupTable finds exactly what a map from hash to block finds, under
// random sequences that share prefixes and differ inside groups (the spill
// path), published and removed in random order.
func TestGroupTableIsAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	gt := newGroupTable(64)
	want := map[uint64]int32{}
	where := map[uint64]int32{} // hash → at
	var seqs [][]uint64
	for range 40 {
		// A sequence shares a random prefix of an earlier one, then goes
		// its own way, often inside a group.
		var s []uint64
		if len(seqs) > 0 && rng.IntN(3) > 0 {
			p := seqs[rng.IntN(len(seqs))]
			s = append(s, p[:rng.IntN(len(p))]...)
		}
		for len(s) < 10+rng.IntN(60) {
			s = append(s, ChainHash(lastOr0(s), rng.Uint64()%5))
		}
		seqs = append(seqs, s)
	}
	next := int32(0)
	for op := range 20_000 {
		s := seqs[rng.IntN(len(seqs))]
		i := rng.IntN(len(s))
		cur := newCursor()
		h := s[i]
		if rng.IntN(2) == 0 {
			at, ok := gt.insert(&cur, s, i, next)
			_, had := want[h]
			if ok == had {
				t.Fatalf("op %d: insert of a hash present=%v reported %v", op, had, ok)
			}
			if ok {
				want[h], where[h] = next, at
				next++
			}
		} else if at, ok := where[h]; ok {
			gt.remove(at, h)
			delete(want, h)
			delete(where, h)
		}
		for _, s := range seqs[:5] {
			cur := newCursor()
			for i, h := range s {
				b, ok := want[h]
				if !ok {
					b = none
				}
				if got := gt.find(&cur, s, i); got != b {
					t.Fatalf("op %d: find(block %d) = %d, want %d", op, i, got, b)
				}
			}
		}
		if gt.published != len(want) {
			t.Fatalf("op %d: %d published, want %d", op, gt.published, len(want))
		}
	}
	if gt.spill.Len() == 0 {
		t.Error("no block spilled: the test does not reach that path")
	}
}

func lastOr0(s []uint64) uint64 {
	if len(s) == 0 {
		return 0
	}
	return s[len(s)-1]
}
