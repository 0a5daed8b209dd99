package results

import "testing"

func TestCacheBounds(t *testing.T) {
	seq := func(ids ...uint64) []uint64 { return ids }
	results := []Result{
		// A prompt of 3 blocks (48 tokens) and its reply's block.
		{Sent: 0, PromptTokens: 48, PromptBlocks: seq(1, 2, 3), SequenceBlocks: seq(1, 2, 3, 4)},
		// Its next turn reuses all 4 blocks and adds one.
		{Sent: 1, PromptTokens: 80, PromptBlocks: seq(1, 2, 3, 4, 5), SequenceBlocks: seq(1, 2, 3, 4, 5, 6)},
		// An unrelated prompt of 2 blocks.
		{Sent: 2, PromptTokens: 32, PromptBlocks: seq(7, 8), SequenceBlocks: seq(7, 8, 9)},
		// The first prompt again.
		{Sent: 3, PromptTokens: 48, PromptBlocks: seq(1, 2, 3), SequenceBlocks: seq(1, 2, 3, 10)},
		// A failed request does not count.
		{Sent: 4, PromptTokens: 1000, Error: "status 500"},
	}
	// Unlimited: 64 of 80, then 47 of 48 (the last block is recomputed).
	got := CacheBounds(results, 16, 5)
	if want := (64.0 + 47) / 208; !near(got.Unlimited, want) {
		t.Errorf("unlimited = %.4f, want %.4f", got.Unlimited, want)
	}
	// With 5 blocks the first conversation's 6 blocks no longer fit beside
	// the third prompt's 3: the repeat of the first prompt misses blocks.
	if got.Ideal >= got.Unlimited || got.Ideal <= 0 {
		t.Errorf("ideal %.4f should be between 0 and the unlimited %.4f", got.Ideal, got.Unlimited)
	}
	if b := CacheBounds(nil, 16, 5); b != (Bounds{}) {
		t.Errorf("no results: %+v", b)
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
