package router

import (
	"github.com/kvroute/kvroute/internal/fleet"
)

// KVEvents tells what backends hold from the engines' own KV events
// (internal/kvevents follows vLLM's), where the prefix index only guesses.
type KVEvents interface {
	// Match sets dst[i] to what candidate cands[i] holds of req's prompt.
	// dst has len(cands) entries. It must be safe for concurrent use; it
	// may wait for the prompt's token ids, within a bound of its own.
	Match(req *Request, cands []*fleet.Backend, dst []KVState)
}

// KVState is what one backend's KV events say of a prompt.
type KVState struct {
	// Tokens are the prompt's leading tokens the backend holds (in whole
	// engine blocks).
	Tokens int
	// Known: the backend's events say something; Exact: they are complete
	// (every event since the engine started, none missed), so Tokens is
	// what it holds, not a lower bound.
	Known, Exact bool
}

// KVHolders is what a KVEvents also offers when it can name the backends
// its events say hold a prompt's deepest blocks without looking at every
// backend (kvevents.Store.Deepest): a pruned pick then scores them too.
// Without it, a backend whose events say it holds a prefix the index has
// forgotten (evicted from the index's LRU, or placed by another router
// replica) is scored only if it is among the least loaded.
type KVHolders interface {
	// Holders appends to dst, without repeating any already there, up to
	// want backends holding the deepest part of req's prompt, deepest
	// first, and returns dst. They need not be candidates. Safe for
	// concurrent use.
	Holders(req *Request, cands []*fleet.Backend, dst []int32, want int) []int32
}
