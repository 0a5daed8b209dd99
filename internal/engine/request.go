package engine

import "time"

// State is where a request is in its life inside one engine.
type State uint8

// The states of a request. A preempted request goes back to Waiting and is
// recomputed from its cached prefix when it is scheduled again.
const (
	StateNew State = iota
	StateWaiting
	StateRunning
	StateFinished
	StateAborted
)

func (s State) String() string {
	switch s {
	case StateNew:
		return "new"
	case StateWaiting:
		return "waiting"
	case StateRunning:
		return "running"
	case StateFinished:
		return "finished"
	case StateAborted:
		return "aborted"
	}
	return "unknown"
}

// Request is one generation request inside an engine. The caller fills the
// input fields before Add; the engine owns everything else until the request
// finishes or is aborted. A Request is not safe for concurrent use: read its
// output fields only from the goroutine that drives the engine.
type Request struct {
	// ID is the caller's identifier; the engine does not interpret it.
	ID uint64
	// PromptLen is the number of prompt tokens (at least 1).
	PromptLen int
	// MaxTokens is the exact number of tokens to generate (at least 1).
	MaxTokens int
	// BlockHashes are the chained hashes of the full blocks of the whole
	// sequence (prompt followed by output), in order, as made by HashTokens or
	// ChainHash. It may cover fewer blocks than the sequence: blocks past its
	// end are computed but never shared through the prefix cache.
	BlockHashes []uint64
	// Adapter names the LoRA adapter the request runs under (the caller's
	// number for it); 0 is the base model. The caller seeds BlockHashes
	// with the adapter (SeedHashes).
	Adapter int32
	// RemoteTokens are the prompt tokens whose KV was computed by another
	// server and pulled here (a disaggregated decode, vLLM's
	// do_remote_prefill): at admission they count as computed beyond the
	// local prefix hits, and their blocks are allocated and published
	// without compute. At most PromptLen-1: the last prompt token is
	// computed here, to sample from.
	RemoteTokens int

	// Arrival is when Add was called, in the engine's clock.
	Arrival time.Duration
	// FirstToken is the end of the step that produced the first output token.
	FirstToken time.Duration
	// LastToken is the end of the step that produced the latest output token.
	LastToken time.Duration
	// Finish is when the request finished or was aborted.
	Finish time.Duration
	// CachedTokens is the number of prompt tokens found in the prefix cache
	// when the request was first scheduled (vLLM's cached_tokens).
	CachedTokens int
	// Output is the number of tokens generated so far.
	Output int
	// Preemptions counts how often the request lost its KV blocks and had to
	// be recomputed.
	Preemptions int
	// State is where the request is now.
	State State

	computed  int     // tokens whose KV is in blocks
	scheduled int     // tokens scheduled in the current step
	blocks    []int32 // KV blocks held, in sequence order
	admitted  bool    // scheduled at least once (prefix stats counted)
	slot      int32   // 1 + the slot it runs in (Profile.Slots), 0: none
}

// numTokens is the length of the sequence so far: prompt plus output.
func (r *Request) numTokens() int { return r.PromptLen + r.Output }

// Done reports whether the request has finished or was aborted.
func (r *Request) Done() bool { return r.State == StateFinished || r.State == StateAborted }

// Reset makes r a new request, with every field zero, but keeps the
// memory of its KV block list for the next one: a simulator that reuses
// its Request values then does not allocate a list per request. r must be
// done or never added.
func (r *Request) Reset() {
	blocks := r.blocks[:0]
	*r = Request{blocks: blocks}
}
