package router

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/kvroute/kvroute/internal/prefix"
)

// Request is what the router knows about one request: the facts the proxy
// extracted from it.
type Request struct {
	// Model is the requested model id.
	Model string
	// Adapter is the LoRA adapter the request runs under: Model, when the
	// candidates list it as an adapter (Router.Route sets it), or as the
	// caller sets it; empty for a base model. Prefix hashes are seeded
	// with it (PrefixHashes).
	Adapter string
	// SessionKey groups the turns of one conversation (X-Session-ID, else
	// the body's keys in the proxy's order: prompt_cache_key,
	// previous_response_id, safety_identifier, user, metadata); empty when
	// the client gave none.
	SessionKey string
	// Prompt is the prompt rendered canonically: for chat, the role and
	// content of every message in order; for completions, the prompt text.
	// Equal conversation prefixes give equal Prompt prefixes.
	Prompt string
	// MaxTokens is the requested output length; 0 when not given.
	MaxTokens int
	// PreviousResponseID is a Responses API request's
	// previous_response_id: the Router sends it to the backend that
	// produced that response, when it saw it and that backend is a
	// candidate (policies.Options.ResponsePins).
	PreviousResponseID string
	// Body is the request's JSON body as the client sent it (the proxy
	// sets it): a KVEvents implementation has the backend tokenize its
	// messages with the model's own chat template. Nil from other callers.
	Body []byte

	// The fields below are facts that a caller who has tokenized the
	// prompt (the fleet simulator) may give, so that policies need not
	// estimate the length from Prompt or hash its text. The proxy leaves
	// them zero, and the Router fills PromptTokens.

	// PromptTokens is the prompt's length in tokens: exact when the caller
	// counted it (positive before routing); otherwise Router.Route sets its
	// estimate before the policy picks, so that every policy and the load
	// accounting work from one number.
	PromptTokens int
	// TokenBlocks, when not nil, are the chained hashes of the prompt's
	// full blocks of TokenBlockSize tokens (as engine.HashTokens makes
	// them): equal hashes mean equal prompts up to the end of that block.
	// A policy's prefix index uses them instead of hashing Prompt.
	TokenBlocks    []uint64
	TokenBlockSize int

	// SplitTTFT, when positive, is the request's predicted time to first
	// token through the prefill pool (its cheapest prefill server, the KV
	// transfer and a decode step), which a priced splitter (SplitPricer)
	// sets before the pick so that a policy can choose the decode server
	// for the cheaper of the two ways (docs/decisions/0020-priced-pd-split.md).
	SplitTTFT time.Duration
}

// TokenBytes is the bytes of prompt text a token stands for in the prefix
// indexes' block sizes when a request is given by token blocks: a caller
// that wants an index block of n tokens sets n × TokenBytes bytes.
const TokenBytes = int(DefaultRatio)

// PrefixHashes appends to dst the hashes a prefix index with blocks of
// blockBytes bytes of prompt text uses for req: from TokenBlocks when the
// caller gave them, else hashed from Prompt. With TokenBlocks, an index
// block of k token blocks (at DefaultRatio bytes a token) takes every k-th
// hash, the chained hash that names the whole prefix up to its end; a token
// block of k index blocks stands for k hashes derived from its own, so the
// index counts, and is sized in, its own blocks whatever the caller's.
//
// Under an adapter every hash is seeded with its name: KV computed under one
// adapter is not reused under another or the base model (lora.go).
func (req *Request) PrefixHashes(dst []uint64, blockBytes int) []uint64 {
	n := len(dst)
	dst = req.unseededHashes(dst, blockBytes)
	seedAdapter(dst[n:], req.Adapter)
	return dst
}

func (req *Request) unseededHashes(dst []uint64, blockBytes int) []uint64 {
	if req.TokenBlocks != nil && req.TokenBlockSize > 0 {
		indexTokens := int(float64(blockBytes) / DefaultRatio)
		if float64(indexTokens)*DefaultRatio == float64(blockBytes) && indexTokens > 0 {
			switch {
			case indexTokens%req.TokenBlockSize == 0:
				k := indexTokens / req.TokenBlockSize
				for i := k - 1; i < len(req.TokenBlocks); i += k {
					dst = append(dst, req.TokenBlocks[i])
				}
				return dst
			case req.TokenBlockSize%indexTokens == 0:
				k := req.TokenBlockSize / indexTokens
				for _, h := range req.TokenBlocks {
					for j := range k {
						dst = append(dst, subBlockHash(h, j))
					}
				}
				return dst
			}
		}
	}
	return prefix.Hash(dst, req.Prompt, blockBytes)
}

// subBlockHash names the j-th part of the block hashed h: h mixed, so that
// hashes with a simple relation (like the test's) do not give equal parts,
// then offset by j and mixed again (splitmix64's finaliser each time).
func subBlockHash(h uint64, j int) uint64 {
	return mix64(mix64(h) + uint64(j+1)*0x9e3779b97f4a7c15)
}

func mix64(x uint64) uint64 {
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// CharText returns the text a character-level prefix tree indexes for req,
// and how many prompt tokens one of its bytes stands for: Prompt at
// 1/DefaultRatio tokens a byte; for a request given only by TokenBlocks, a
// stand-in of 8 bytes per block (its chained hash), so that equal prefixes
// still give equal leading bytes.
func (req *Request) CharText() (string, float64) {
	if req.Prompt != "" || req.TokenBlocks == nil || req.TokenBlockSize <= 0 {
		return req.Prompt, 1 / DefaultRatio
	}
	b := make([]byte, 0, 8*len(req.TokenBlocks))
	for _, h := range req.TokenBlocks {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return string(b), float64(req.TokenBlockSize) / 8
}

// PromptTokensAt returns PromptTokens when the caller gave it, else Prompt's
// length at ratio bytes a token.
func (req *Request) PromptTokensAt(ratio float64) int {
	if req.PromptTokens > 0 {
		return req.PromptTokens
	}
	return int(math.Ceil(float64(len(req.Prompt)) / ratio))
}
