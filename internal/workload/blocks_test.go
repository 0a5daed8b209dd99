package workload

import (
	"testing"

	"github.com/kvroute/kvroute/internal/tokenizer"
)

func TestBlockTextHasExactLength(t *testing.T) {
	for id := range uint64(20) {
		for _, n := range []int{1, 2, 17, 512} {
			text := BlockText(id, n)
			if got := tokenizer.Count(text); got != n {
				t.Fatalf("block %d of %d tokens has %d", id, n, got)
			}
		}
	}
	if BlockText(3, 512) != BlockText(3, 512) || BlockText(3, 512) == BlockText(4, 512) {
		t.Error("block text must depend on the id alone")
	}
}

func TestBlocksTextSharesPrefixes(t *testing.T) {
	a := BlocksText([]uint64{1, 2, 3}, 512, 1400)
	b := BlocksText([]uint64{1, 2, 9}, 512, 1500)
	if got := tokenizer.Count(a); got != 1400 {
		t.Errorf("%d tokens, want 1400", got)
	}
	ta, tb := tokenizer.Encode(nil, a), tokenizer.Encode(nil, b)
	common := 0
	for common < len(ta) && common < len(tb) && ta[common] == tb[common] {
		common++
	}
	if common != 1024 {
		t.Errorf("prompts sharing 2 blocks share %d leading tokens, want 1024", common)
	}
	full, part := tokenizer.Encode(nil, BlockText(7, 512)), tokenizer.Encode(nil, BlockText(7, 100))
	same := 0
	for same < len(part) && part[same] == full[same] {
		same++
	}
	if same < 90 {
		t.Errorf("a 100-token partial block shares only %d leading tokens with the full block", same)
	}
}
