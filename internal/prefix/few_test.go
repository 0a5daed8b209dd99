package prefix

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// MatchFew agrees with Match for every backend it is asked about, through
// insertions, evictions and forgets that make blocks hot (held by more than
// hotHolders backends) and cold again; and the backends it adds hold the
// deepest blocks.
func TestMatchFewAgreesWithMatch(t *testing.T) {
	const n = 48
	r := rand.New(rand.NewPCG(7, 8))
	ix := NewTiered(n, 24, 48)
	// Prompts share prefixes: a system prompt every one starts with, a
	// handful of documents, and per-conversation tails.
	prompt := func() []uint64 {
		ids := []byte{'S', byte('a' + r.IntN(5)), byte('a' + r.IntN(20))}
		text := ""
		for _, id := range ids[:1+r.IntN(len(ids))] {
			text += string(rune(id)) + text
			for len(text)%16 != 0 {
				text += "."
			}
		}
		return Hash(nil, text+text, 16)
	}
	full0, full1 := make([]int, n), make([]int, n)
	few0, few1 := make([]int, n), make([]int, n)
	for step := range 20_000 {
		hashes := prompt()
		switch k := r.IntN(10); {
		case k < 7:
			ix.Insert(r.IntN(n), hashes)
		case k < 9:
			ix.ForgetTier(r.IntN(2), r.IntN(n), hashes, r.IntN(len(hashes)+1))
		default:
			ix.SetTierCapacity(r.IntN(2), r.IntN(n), 8+r.IntN(40))
		}
		if step%7 != 0 {
			continue
		}
		ix.Match(hashes, full0, full1)
		asked := []int32{int32(r.IntN(n)), int32(r.IntN(n))}
		asked = slices.Compact(asked)
		clear(few0)
		clear(few1)
		got, gotLongest := ix.MatchFew(hashes, slices.Clone(asked), 4, few0, few1)
		if !slices.Equal(got[:len(asked)], asked) || len(got) > len(asked)+4 {
			t.Fatalf("step %d: backends %v from %v", step, got, asked)
		}
		best := 0
		for _, b := range got {
			if few0[b] != full0[b] || few1[b] != full1[b] {
				t.Fatalf("step %d: backend %d: MatchFew %d/%d, Match %d/%d", step, b, few0[b], few1[b], full0[b], full1[b])
			}
			best = max(best, few0[b])
		}
		if gotLongest != best {
			t.Fatalf("step %d: longest %d, want %d among %v", step, gotLongest, best, got)
		}
	}
	if ix.held.Len() == 0 {
		t.Error("no block ever became hot: the test does not cover held")
	}
}

// The backends MatchFew adds are those holding the deepest blocks, deepest
// first, and never one already asked about.
func TestMatchFewDeepestFirst(t *testing.T) {
	ix := NewTiered(4, 100, 200)
	long := Hash(nil, text(1, 10*16), 16)
	ix.Insert(0, long[:2])
	ix.Insert(1, long[:8])
	ix.Insert(2, long[:5])
	ix.Insert(3, Hash(nil, text(2, 4*16), 16))
	m0, m1 := make([]int, 4), make([]int, 4)
	got, longest := ix.MatchFew(long, []int32{3}, 2, m0, m1)
	if want := []int32{3, 1, 2}; !slices.Equal(got, want) {
		t.Errorf("backends %v, want %v", got, want)
	}
	if longest != 8 || m0[1] != 8 || m1[2] != 5 || m0[3] != 0 || m0[0] != 0 {
		t.Errorf("longest %d, matched %v %v", longest, m0, m1)
	}
	if got, _ := ix.MatchFew(long, []int32{1}, 1, m0, m1); !slices.Equal(got, []int32{1, 2}) {
		t.Errorf("asked about 1: backends %v, want [1 2]", got)
	}
}
