package kvevents

import "testing"

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
