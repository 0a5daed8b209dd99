package emulator

import (
	"fmt"
	"math"
	"net/http"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/tokenizer"
)

// Natural reply lengths, in tokens with the closing EOT, for requests that
// set no limit.
const (
	minNaturalTokens = 16
	maxNaturalTokens = 512
)

// newCall plans the request for prompt, whose last pos tokens are a reply
// under way (0: none): its output (maxTokens tokens, or a natural length
// ending with EOT when maxTokens is nil) and the block hashes of the whole
// sequence. The reply is a function of the prompt before it and of the
// position alone: the tokens from pos on of the reply the server gives that
// prompt, so that continuing a cut reply yields exactly its rest. what
// names the prompt in error messages.
func (s *Server) newCall(prompt []int32, pos int, maxTokens *int, what string) (*call, *openai.Error) {
	limit := s.profile.MaxModelLen
	seed := s.outputSeed(prompt[:len(prompt)-pos])
	c := &call{notify: make(chan struct{}, 1)}
	var ids []int32
	switch {
	case maxTokens != nil:
		if len(prompt)+*maxTokens > limit {
			return nil, contextTooLong(limit, len(prompt), *maxTokens, what)
		}
		c.total = *maxTokens
		ids, c.pieces = generateFrom(seed, pos, c.total)
	case len(prompt) >= limit:
		return nil, contextTooLong(limit, len(prompt), 1, what)
	default:
		// The natural reply's length counts from the reply's start: what
		// is under way is part of it. At least the EOT is left.
		c.total = max(naturalLength(seed)-pos, 1)
		if room := limit - len(prompt); c.total > room {
			// Cut off by the context, as vLLM would: no EOT, "length".
			c.total = room
			ids, c.pieces = generateFrom(seed, pos, c.total)
			break
		}
		c.stop = true
		ids, c.pieces = generateFrom(seed, pos, c.total-1)
		ids = append(ids, tokenizer.EOT)
	}
	seq := append(prompt[:len(prompt):len(prompt)], ids...)
	c.seq = seq
	c.req = engine.Request{
		PromptLen:   len(prompt),
		MaxTokens:   c.total,
		BlockHashes: engine.HashTokens(nil, seq, s.profile.BlockSize),
	}
	return c, nil
}

// generateFrom returns the n tokens of the reply seeded seed from position
// pos on.
func generateFrom(seed uint64, pos, n int) ([]int32, []string) {
	if n <= 0 {
		return nil, nil
	}
	ids, pieces := tokenizer.Generate(seed, pos+n)
	return ids[pos:], pieces[pos:]
}

// contextTooLong is vLLM's error for a request longer than the model's
// context.
func contextTooLong(limit, prompt, output int, what string) *openai.Error {
	return &openai.Error{
		Status: http.StatusBadRequest,
		Message: fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens "+
			"(%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
			limit, prompt+output, prompt, what, output, what),
		Type: openai.TypeInvalidRequest,
		Code: "context_length_exceeded",
	}
}

// outputSeed derives the seed of a request's output from the server's seed
// and the prompt, so that an equal prompt gets an equal reply.
func (s *Server) outputSeed(prompt []int32) uint64 { return tokenizer.ReplySeed(s.seed, prompt) }

// naturalLength is the length, EOT included, of the reply a request with no
// token limit gets: log-uniform in [minNaturalTokens, maxNaturalTokens], so
// short answers are as common as long ones in ratio terms (median about 90
// tokens, mean about 142).
func naturalLength(seed uint64) int {
	u := float64(splitmix64(seed)>>11) / (1 << 53) // uniform in [0, 1)
	n := minNaturalTokens * math.Pow(maxNaturalTokens/minNaturalTokens, u)
	return min(int(n), maxNaturalTokens)
}

// splitmix64 is a bijective mixer that decorrelates the length from the
// text, which Generate derives from the same seed.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
