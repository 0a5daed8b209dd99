// Package router decides which backend serves a request. A policy is a small
// struct behind the Policy interface; the proxy asks it to pick among the
// healthy backends that serve the request's model, counts the request on the
// chosen backend, and reports the outcome back to policies that learn.
package router

import (
	"encoding/binary"
	"errors"
	"math"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/prefix"
)

// ErrNoBackend means no backend can take the request; the proxy answers 503.
var ErrNoBackend = errors.New("no backend available")

// Request is what the router knows about one request: the facts the proxy
// extracted from it.
type Request struct {
	// Model is the requested model id.
	Model string
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
	// candidate (Options.ResponsePins).
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
}

// TokenBytes is the bytes of prompt text a token stands for in the prefix
// indexes' block sizes when a request is given by token blocks: a caller
// that wants an index block of n tokens sets n × TokenBytes bytes.
const TokenBytes = int(defaultRatio)

// prefixHashes appends to dst the hashes a prefix index with blocks of
// blockBytes bytes of prompt text uses for req: from TokenBlocks when the
// caller gave them, else hashed from Prompt. With TokenBlocks, an index
// block of k token blocks (at defaultRatio bytes a token) takes every k-th
// hash, the chained hash that names the whole prefix up to its end; a token
// block of k index blocks stands for k hashes derived from its own, so the
// index counts, and is sized in, its own blocks whatever the caller's.
func (req *Request) prefixHashes(dst []uint64, blockBytes int) []uint64 {
	if req.TokenBlocks != nil && req.TokenBlockSize > 0 {
		indexTokens := int(float64(blockBytes) / defaultRatio)
		if float64(indexTokens)*defaultRatio == float64(blockBytes) && indexTokens > 0 {
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

// charText returns the text a character-level prefix tree indexes for req,
// and how many prompt tokens one of its bytes stands for: Prompt at
// 1/defaultRatio tokens a byte; for a request given only by TokenBlocks, a
// stand-in of 8 bytes per block (its chained hash), so that equal prefixes
// still give equal leading bytes.
func (req *Request) charText() (string, float64) {
	if req.Prompt != "" || req.TokenBlocks == nil || req.TokenBlockSize <= 0 {
		return req.Prompt, 1 / defaultRatio
	}
	b := make([]byte, 0, 8*len(req.TokenBlocks))
	for _, h := range req.TokenBlocks {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return string(b), float64(req.TokenBlockSize) / 8
}

// promptTokens returns PromptTokens when the caller gave it, else Prompt's
// length at ratio bytes a token.
func (req *Request) promptTokens(ratio float64) int {
	if req.PromptTokens > 0 {
		return req.PromptTokens
	}
	return int(math.Ceil(float64(len(req.Prompt)) / ratio))
}

// Decision is a policy's choice and its explanation.
type Decision struct {
	// Backend is the chosen backend.
	Backend *fleet.Backend
	// Reason says why, in a word: "prefix", "session", "least-cost",
	// "spill", "round-robin", "least-request", "hash", ...
	Reason string
	// Cached is how many of the request's prompt tokens the policy expects
	// the backend to have cached (0 for policies that do not know). The
	// router counts the rest as prefill queued there until the first token.
	Cached int
	// PredictedTTFT is the policy's predicted time to first token; 0 for
	// policies that do not predict.
	PredictedTTFT time.Duration
	// Scores explains the choice, one entry per candidate (kvroute, among
	// more than 16: the chosen one and the 15 cheapest others); nil for
	// policies that do not score.
	Scores []Score
	// Done, when not nil, is called once with the request's outcome: a
	// learning policy keeps what it needs to learn from this pick in it, as
	// gRPC's PickResult.Done does. The Ticket calls it; it must not block.
	Done func(Outcome)
}

// Score is one candidate's evaluation by a scoring policy.
type Score struct {
	// Backend is the candidate's name.
	Backend string
	// Cost is the policy's cost; lower is better (for kvroute: seconds).
	Cost float64
	// TTFT is the predicted time to first token there; 0 if not predicted.
	TTFT time.Duration
	// Cached is the predicted cached prompt tokens there.
	Cached int
}

// Policy picks a backend for a request. Implementations are safe for
// concurrent use and must not block.
type Policy interface {
	// Name is the policy's --policy value.
	Name() string
	// Pick chooses one of cands: healthy backends that serve req.Model,
	// never empty, in fleet order. req.PromptTokens is set (the Router
	// estimates it when the caller did not count it).
	Pick(req *Request, cands []*fleet.Backend) (Decision, error)
}

// FleetWatcher is implemented by policies that keep state per backend
// index. SetBackends tells them the fleet's whole new set of backends, in
// fleet order, whenever it changes (fleet.Fleet.Watch, through
// Router.SetBackends): they make room for indexes beyond those they were
// built for, before any such backend is a candidate, and forget what they
// learned about backends no longer in the set. Indexes are never reused, so
// a removed backend's requests still in flight may finish into state that
// is no longer read. SetBackends is safe for concurrent use with Pick and
// Done; it may take locks and allocate.
type FleetWatcher interface {
	SetBackends(backends []*fleet.Backend)
}

// Outcome is what happened to a routed request, as its driver (the proxy,
// the simulator) saw it.
type Outcome struct {
	// Status is the backend's HTTP status; 0 if it never answered.
	Status int
	// PromptTokens, CachedTokens and CompletionTokens come from the
	// response's usage; -1 when it had none.
	PromptTokens, CachedTokens, CompletionTokens int
	// TTFT is the time from routing to the first byte of the response body
	// (of the first token, when streaming); Latency to its end.
	TTFT, Latency time.Duration
	// Tokens is the number of streamed chunks carrying content (0 when not
	// streaming).
	Tokens int
	// ResponseID is the id of the Responses API response the backend
	// produced ("" for other requests): the Router remembers which
	// backend holds it, for the requests that continue it.
	ResponseID string
}

// Failed returns the outcome of an attempt that got no usable answer:
// the backend was not reached, or answered status (0 when it never did)
// before any of the response reached the client.
func Failed(status int) Outcome {
	return Outcome{Status: status, PromptTokens: -1, CachedTokens: -1, CompletionTokens: -1}
}
