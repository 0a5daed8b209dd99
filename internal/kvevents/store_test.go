package kvevents

import (
	"slices"
	"testing"
)

// seq returns n tokens: 1, 2, ..., n.
func seq(n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(i + 1)
	}
	return t
}

func storedEv(hashes []uint64, parent uint64, hasParent bool, tokens []int32, medium string) Event {
	return Event{Kind: BlockStored, Hashes: hashes, Parent: parent, HasParent: hasParent, Tokens: tokens, BlockSize: 2, Medium: medium}
}

func TestStoreMatch(t *testing.T) {
	prompt := seq(11) // 5 full blocks of 2
	keys := func(bs int) []uint64 { return TokenChain(nil, prompt, bs) }
	// The engine's hashes are its own business: any distinct numbers.
	tests := []struct {
		name    string
		events  []Event
		wantGPU int
		wantAny int
	}{
		{name: "none", wantGPU: 0, wantAny: 0},
		{name: "chain across events", events: []Event{
			storedEv([]uint64{101, 102, 103}, 0, false, prompt[:6], MediumGPU),
			storedEv([]uint64{104, 105}, 103, true, prompt[6:10], MediumGPU),
		}, wantGPU: 5, wantAny: 5},
		{name: "a removed middle block ends the match", events: []Event{
			storedEv([]uint64{101, 102, 103}, 0, false, prompt[:6], MediumGPU),
			{Kind: BlockRemoved, Hashes: []uint64{102}, Medium: MediumGPU},
		}, wantGPU: 1, wantAny: 1},
		{name: "offloaded tail on the CPU", events: []Event{
			storedEv([]uint64{101, 102}, 0, false, prompt[:4], MediumGPU),
			storedEv([]uint64{103, 104}, 102, true, prompt[4:8], MediumCPU),
		}, wantGPU: 2, wantAny: 4},
		{name: "other tokens do not match", events: []Event{
			storedEv([]uint64{101, 102}, 0, false, []int32{1, 2, 9, 9}, MediumGPU),
		}, wantGPU: 1, wantAny: 1},
		{name: "an unknown parent is an orphan", events: []Event{
			storedEv([]uint64{103}, 102, true, prompt[4:6], MediumGPU),
		}, wantGPU: 0, wantAny: 0},
		{name: "stored twice, removed once", events: []Event{
			storedEv([]uint64{101}, 0, false, prompt[:2], MediumGPU),
			storedEv([]uint64{101}, 0, false, prompt[:2], MediumGPU),
			{Kind: BlockRemoved, Hashes: []uint64{101}, Medium: MediumGPU},
		}, wantGPU: 1, wantAny: 1},
		{name: "cleared", events: []Event{
			storedEv([]uint64{101, 102}, 0, false, prompt[:4], MediumGPU),
			{Kind: AllBlocksCleared},
		}, wantGPU: 0, wantAny: 0},
		{name: "another group is ignored", events: []Event{
			{Kind: BlockStored, Hashes: []uint64{101}, Tokens: prompt[:2], BlockSize: 2, Medium: MediumGPU, Group: 1},
		}, wantGPU: 0, wantAny: 0},
		{name: "a LoRA's blocks are not the base model's", events: []Event{
			{Kind: BlockStored, Hashes: []uint64{101}, Tokens: prompt[:2], BlockSize: 2, Medium: MediumGPU, LoRAName: "sql"},
		}, wantGPU: 0, wantAny: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStore(KeyTokens)
			s.Reset(3, Exact)
			s.Apply(3, &Batch{Events: append([]Event{storedEv([]uint64{900}, 0, false, []int32{7, 7}, MediumGPU)}, tt.events...)})
			st, bs, gpu, anyTier := s.Match(3, keys)
			if st != Exact || bs != 2 || gpu != tt.wantGPU || anyTier != tt.wantAny {
				t.Fatalf("Match = %v, %d, %d, %d; want Exact, 2, %d, %d", st, bs, gpu, anyTier, tt.wantGPU, tt.wantAny)
			}
		})
	}
}

// TestStoreSGLangPages follows SGLang's radix cache as its events tell it:
// one event per page, chained by parent_block_hash; page size 1 (its
// default); a node split announced as the node removed and its two halves
// stored; a node that ends between pages with a short last page.
func TestStoreSGLangPages(t *testing.T) {
	page := func(hash, parent uint64, tokens ...int32) Event {
		return Event{Kind: BlockStored, Hashes: []uint64{hash}, Parent: parent, HasParent: parent != 0,
			Tokens: tokens, BlockSize: len(tokens), Medium: MediumGPU}
	}
	removed := func(hashes ...uint64) []Event {
		var evs []Event
		for _, h := range hashes {
			evs = append(evs, Event{Kind: BlockRemoved, Hashes: []uint64{h}, Medium: MediumGPU})
		}
		return evs
	}
	prompt := []int32{5, 6, 7, 8}
	t.Run("page size 1 and a split", func(t *testing.T) {
		s := NewStore(KeyTokens)
		s.Reset(0, Exact)
		// A node [5 6 7 8], then split at 2 by a prompt [5 6 9]: the node
		// is removed and stored again as [5 6] and [7 8], then [9] added.
		node := []Event{page(11, 0, 5), page(12, 11, 6), page(13, 12, 7), page(14, 13, 8)}
		s.Apply(0, &Batch{Events: node})
		split := append(removed(11, 12, 13, 14), node...)
		split = append(split, page(15, 12, 9))
		s.Apply(0, &Batch{Events: split})
		if _, bs, gpu, _ := s.Match(0, func(bs int) []uint64 { return TokenChain(nil, prompt, bs) }); bs != 1 || gpu != 4 {
			t.Fatalf("after the split: block size %d, %d tokens matched; want 1, 4", bs, gpu)
		}
		if _, _, gpu, _ := s.Match(0, func(bs int) []uint64 { return TokenChain(nil, []int32{5, 6, 9}, bs) }); gpu != 3 {
			t.Fatalf("the new branch matched %d tokens, want 3", gpu)
		}
		s.Apply(0, &Batch{Events: removed(13, 14)}) // the leaf [7 8] evicted
		if _, _, gpu, _ := s.Match(0, func(bs int) []uint64 { return TokenChain(nil, prompt, bs) }); gpu != 2 || s.Blocks(0, MediumGPU) != 3 {
			t.Fatalf("after evicting [7 8]: %d matched, %d held; want 2, 3", gpu, s.Blocks(0, MediumGPU))
		}
	})
	t.Run("a short last page", func(t *testing.T) {
		s := NewStore(KeyTokens)
		s.Reset(0, Exact)
		s.Apply(0, &Batch{Events: []Event{page(21, 0, 5, 6), page(22, 21, 7)}})
		_, bs, gpu, _ := s.Match(0, func(bs int) []uint64 { return TokenChain(nil, prompt, bs) })
		if bs != 2 || gpu != 1 {
			t.Fatalf("block size %d, %d blocks matched; want 2 (the short page does not change it), 1", bs, gpu)
		}
		s.Apply(0, &Batch{Events: removed(22, 21)})
		if n := s.Blocks(0, MediumGPU); n != 0 {
			t.Fatalf("%d blocks left after removing both pages", n)
		}
	})
}

func TestStoreStates(t *testing.T) {
	s := NewStore(KeyEngine)
	keys := func(int) []uint64 { return []uint64{5, 6} }
	if st, _, _, _ := s.Match(1, keys); st != Unknown {
		t.Fatalf("a backend never heard of is %v", st)
	}
	s.Reset(1, Partial)
	s.Apply(1, &Batch{Events: []Event{{Kind: BlockStored, Hashes: []uint64{5, 6}, BlockSize: 16, Medium: MediumGPU}}})
	if st, _, gpu, _ := s.Match(1, keys); st != Partial || gpu != 2 {
		t.Fatalf("Match = %v, %d; want Partial, 2", st, gpu)
	}
	if n := s.Blocks(1, MediumGPU); n != 2 {
		t.Fatalf("Blocks = %d, want 2", n)
	}
	s.Reset(1, Exact)
	if st, _, gpu, _ := s.Match(1, keys); st != Exact || gpu != 0 {
		t.Fatalf("after Reset: %v, %d; want Exact, 0", st, gpu)
	}
	s.Remove(1)
	if st, _, _, _ := s.Match(1, keys); st != Unknown {
		t.Fatalf("a removed backend is %v", st)
	}
}

// MatchGPU, which walks a reverse index of the whole fleet, agrees with
// Match, backend by backend, through random stores, removals, resets and
// clears, in both key modes.
func TestMatchGPUAgrees(t *testing.T) {
	for _, key := range []Key{KeyTokens, KeyEngine} {
		s := NewStore(key)
		rng := uint64(7)
		next := func(n int) int {
			rng = rng*6364136223846793005 + 1442695040888963407
			return int(rng>>33) % n
		}
		prompts := make([][]int32, 4)
		for p := range prompts {
			prompts[p] = make([]int32, 40)
			for i := range prompts[p] {
				prompts[p][i] = int32(p*(i/10) + i) // prompts share early blocks
			}
		}
		// engineHash names block i of prompt p as an engine would: its
		// content and prefix.
		engineHash := func(p, i int) uint64 { return TokenChain(nil, prompts[p][:(i+1)*4], 4)[i] }
		backends := []int{0, 1, 2, 3, 4}
		for _, b := range backends {
			s.Reset(b, Exact)
		}
		for range 3000 {
			b, p := next(5), next(4)
			switch op := next(20); {
			case op < 12:
				from, n := next(10), 1+next(3)
				n = min(n, 10-from)
				ev := Event{Kind: BlockStored, BlockSize: 4, Medium: MediumGPU, Tokens: prompts[p][from*4 : (from+n)*4]}
				if next(4) == 0 {
					ev.Medium = MediumCPU
				}
				for i := from; i < from+n; i++ {
					ev.Hashes = append(ev.Hashes, engineHash(p, i))
				}
				if from > 0 {
					ev.Parent, ev.HasParent = engineHash(p, from-1), true
				}
				s.Apply(b, &Batch{Events: []Event{ev}})
			case op < 19:
				s.Apply(b, &Batch{Events: []Event{{Kind: BlockRemoved, Hashes: []uint64{engineHash(p, next(10))}, Medium: MediumGPU}}})
			case op == 19 && next(5) == 0:
				s.Reset(b, Exact)
			default:
				s.Apply(b, &Batch{Events: []Event{{Kind: AllBlocksCleared}}})
			}
			p = next(4)
			keys := func(bs int) []uint64 {
				if key == KeyEngine {
					out := make([]uint64, 10)
					for i := range out {
						out[i] = engineHash(p, i)
					}
					return out
				}
				return TokenChain(nil, prompts[p], bs)
			}
			got := make([]Matched, len(backends))
			s.MatchGPU(backends, keys, got)
			deepest := s.Deepest(nil, keys, len(backends))
			for i, b := range backends {
				st, bs, gpu, _ := s.Match(b, keys)
				if got[i] != (Matched{State: st, BlockSize: bs, Blocks: gpu}) {
					t.Fatalf("key mode %d, backend %d: MatchGPU %+v, Match %v %d %d", key, b, got[i], st, bs, gpu)
				}
				if gpu > 0 && !slices.Contains(deepest, int32(b)) {
					t.Fatalf("key mode %d, backend %d holds %d leading blocks; Deepest %v", key, b, gpu, deepest)
				}
			}
		}
	}
}

// Deepest names the backends holding the deepest part of a prompt first,
// up to the number asked for, skipping those already named.
func TestStoreDeepest(t *testing.T) {
	prompt := seq(20) // 10 blocks of 2
	keys := func(bs int) []uint64 { return TokenChain(nil, prompt, bs) }
	s := NewStore(KeyTokens)
	for b, blocks := range []int{1, 5, 3, 0} {
		s.Reset(b, Exact)
		if blocks > 0 {
			hashes := make([]uint64, blocks)
			for i := range hashes {
				hashes[i] = uint64(100*b + i + 1)
			}
			s.Apply(b, &Batch{Events: []Event{storedEv(hashes, 0, false, prompt[:2*blocks], MediumGPU)}})
		}
	}
	for _, tc := range []struct {
		name string
		dst  []int32
		want int
		out  []int32
	}{
		{"two deepest", nil, 2, []int32{1, 2}},
		{"every holder", nil, 10, []int32{1, 2, 0}},
		{"skips those named", []int32{1}, 2, []int32{1, 2, 0}},
		{"none asked", nil, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.Deepest(slices.Clone(tc.dst), keys, tc.want); !slices.Equal(got, tc.out) {
				t.Errorf("Deepest = %v, want %v", got, tc.out)
			}
		})
	}
}
