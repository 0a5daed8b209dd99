package workload

import (
	"math/rand/v2"
	"strings"

	"github.com/kvroute/kvroute/internal/tokenizer"
)

// wordTokens[i] is the number of tokens of " "+vocabulary[i] with the
// emulator's tokenizer. Words joined by single spaces tokenize piece by piece
// (each word with its leading space is one piece), so a text's token count
// is the sum over its words.
var wordTokens = func() []int {
	n := make([]int, len(vocabulary))
	for i, w := range vocabulary {
		n[i] = tokenizer.Count(" " + w)
	}
	return n
}()

// BlockText returns the text of the block named id: words drawn from a
// generator seeded by id, exactly tokens tokens long with the emulator's
// tokenizer (and about as long with real ones). Equal ids give equal text,
// and a shorter block with the same id agrees with a longer one up to its
// last word or two (where it is filled to its exact length).
func BlockText(id uint64, tokens int) string {
	var sb strings.Builder
	appendBlock(&sb, id, tokens)
	return sb.String()
}

// appendBlock writes block id's text of tokens tokens. Every block ends
// with a newline so that the tokens of consecutive blocks never merge.
func appendBlock(sb *strings.Builder, id uint64, tokens int) {
	if tokens <= 0 {
		return
	}
	rng := rand.New(rand.NewPCG(id, 0x626c6f636b))
	n := 0
	for n < tokens-1 { // the newline is the last token
		i := rng.IntN(len(vocabulary))
		if n+wordTokens[i] > tokens-1 {
			// Fill the rest with one-token words.
			i = 0
			for wordTokens[i] != 1 {
				i++
			}
		}
		sb.WriteByte(' ')
		sb.WriteString(vocabulary[i])
		n += wordTokens[i]
	}
	sb.WriteByte('\n')
}

// BlocksText is the text of a prompt described by block ids of blockTokens
// tokens each, total tokens long (the last block may be partial).
func BlocksText(ids []uint64, blockTokens, total int) string {
	var sb strings.Builder
	sb.Grow(total * 5)
	for _, id := range ids {
		n := min(blockTokens, total)
		if n <= 0 {
			break
		}
		appendBlock(&sb, id, n)
		total -= n
	}
	return sb.String()
}
