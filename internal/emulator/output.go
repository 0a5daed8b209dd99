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

// newCall plans the request for prompt: its output (maxTokens tokens, or a
// natural length ending with EOT when maxTokens is nil) and the block hashes
// of the whole sequence. what names the prompt in error messages.
func (s *Server) newCall(prompt []int32, maxTokens *int, what string) (*call, *openai.Error) {
	limit := s.profile.MaxModelLen
	seed := s.outputSeed(prompt)
	c := &call{notify: make(chan struct{}, 1)}
	var ids []int32
	switch {
	case maxTokens != nil:
		if len(prompt)+*maxTokens > limit {
			return nil, contextTooLong(limit, len(prompt), *maxTokens, what)
		}
		c.total = *maxTokens
		ids, c.pieces = tokenizer.Generate(seed, c.total)
	case len(prompt) >= limit:
		return nil, contextTooLong(limit, len(prompt), 1, what)
	default:
		c.total = naturalLength(seed)
		if room := limit - len(prompt); c.total > room {
			// Cut off by the context, as vLLM would: no EOT, "length".
			c.total = room
			ids, c.pieces = tokenizer.Generate(seed, c.total)
			break
		}
		c.stop = true
		ids, c.pieces = tokenizer.Generate(seed, c.total-1)
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
