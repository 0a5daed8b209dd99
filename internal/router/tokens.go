package router

import (
	"math"
	"sync"
	"sync/atomic"
)

// Tokens estimates a prompt's length in tokens from its bytes, at a ratio
// learned from the prompt lengths backends report: decayed sums of bytes and
// tokens, so that long prompts, whose estimate matters, weigh most (short
// ones carry the chat template's fixed tokens). Safe for concurrent use.
type Tokens struct {
	// ratio is the bytes per token (float64 bits), read by every request
	// without the lock that guards the sums it is learned from.
	ratio          atomic.Uint64
	mu             sync.Mutex
	bytes, counted float64
}

// DefaultRatio is the bytes of prompt text a token stands for until
// observations say otherwise (English text in a Llama-3 tokenizer). The
// prefix indexes size their blocks of prompt text at DefaultRatio too, so
// that a block of text stands for a fixed number of engine tokens.
const DefaultRatio = 4.0

// The estimator starts as if priorTokens tokens had been seen at
// DefaultRatio, and forgets old observations at ratioDecay each.
const (
	priorTokens = 1000.0
	ratioDecay  = 1 - 1.0/64
)

// NewTokens returns an estimator at the prior ratio.
func NewTokens() *Tokens {
	t := &Tokens{bytes: DefaultRatio * priorTokens, counted: priorTokens}
	t.ratio.Store(math.Float64bits(DefaultRatio))
	return t
}

// Ratio returns the learned bytes of prompt text per token.
func (t *Tokens) Ratio() float64 { return math.Float64frombits(t.ratio.Load()) }

// Estimate returns the tokens of a prompt of len(prompt) bytes.
func (t *Tokens) Estimate(prompt string) int {
	return int(math.Ceil(float64(len(prompt)) / t.Ratio()))
}

// observe learns from a prompt of n bytes that the backend counted as
// tokens tokens; prompts given without text teach nothing.
func (t *Tokens) observe(n, tokens int) {
	if n == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.bytes = t.bytes*ratioDecay + float64(n)
	t.counted = t.counted*ratioDecay + float64(tokens)
	t.ratio.Store(math.Float64bits(t.bytes / t.counted))
}
