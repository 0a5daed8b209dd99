package router

import "github.com/kvroute/kvroute/internal/fleet"

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

// eventCached corrects the index's prediction of a backend's cached prompt
// tokens (sure: its tier 0; maybe: the recent tier) with what the
// backend's events say: exact events replace both, partial ones raise them
// to what they know is there. What the events count is real token ids, so
// it is not cut to the router's estimate of the prompt's length (which
// the caller bounds its uncached tokens by instead).
func eventCached(k KVState, sure, maybe int) (int, int) {
	t := k.Tokens
	switch {
	case k.Exact:
		return t, t
	case k.Known:
		return max(sure, t), max(maybe, t)
	}
	return sure, maybe
}
