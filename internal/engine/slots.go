package engine

// slotPromptSimilarity is llama-server's --slot-prompt-similarity default:
// a request goes to the idle slot sharing the longest prefix with it only
// if that prefix is more than this fraction of what the slot holds.
const slotPromptSimilarity = 0.5

// slotTable models llama-server's parallel slots (--parallel N): each slot
// runs one sequence at a time in its own share of the KV cache and keeps,
// after it ends, the KV of that sequence; the next request landing in the
// slot reuses the prefix it shares with it (cache_prompt, on by default),
// and nothing is shared between slots. A request is given a slot as
// llama-server's get_available_slot chooses one: the idle slot whose held
// sequence shares the longest prefix with the prompt, if the shared part
// is more than slotPromptSimilarity of what the slot holds, else the least
// recently used idle slot. Prefixes are matched in whole KV blocks (the
// engine's block_size), where llama.cpp matches tokens.
//
// A nil *slotTable is the vLLM engine's: no slots, and its methods do
// nothing, so the engine calls them unconditionally.
type slotTable struct {
	slots []slot
	uses  int64 // counts claims: a slot's lastUse orders it for LRU
}

// slot is one llama.cpp slot.
type slot struct {
	// held are the block hashes of the sequence whose KV the slot holds.
	held    []uint64
	busy    bool
	lastUse int64
}

func newSlotTable(n int) *slotTable { return &slotTable{slots: make([]slot, n)} }

// pick returns the idle slot a request whose prompt's blocks hash to
// hashes goes to, and how many leading blocks of hashes that slot holds.
// The engine admits at most one request per slot, so an idle one exists.
func (t *slotTable) pick(hashes []uint64) (slot, kept int) {
	best, bestKept := -1, 0
	for i := range t.slots {
		s := &t.slots[i]
		if s.busy || len(s.held) == 0 {
			continue
		}
		n := commonPrefix(s.held, hashes)
		if n > bestKept && float64(n) > slotPromptSimilarity*float64(len(s.held)) {
			best, bestKept = i, n
		}
	}
	if best >= 0 {
		return best, bestKept
	}
	for i := range t.slots {
		s := &t.slots[i]
		if !s.busy && (best < 0 || s.lastUse < t.slots[best].lastUse) {
			best = i
		}
	}
	// The least recently used slot may still share a prefix with the
	// prompt, below the similarity bar: llama-server reuses it all the same.
	return best, commonPrefix(t.slots[best].held, hashes)
}

// claim gives slot i to r.
func (t *slotTable) claim(i int, r *Request) {
	if t == nil {
		return
	}
	t.uses++
	s := &t.slots[i]
	s.busy, s.lastUse = true, t.uses
	r.slot = int32(i + 1)
}

// release frees r's slot, which keeps the KV of r's first blocks full
// blocks (prompt and output), the prefix the next request there may reuse.
func (t *slotTable) release(r *Request, blocks int) {
	if t == nil || r.slot == 0 {
		return
	}
	s := &t.slots[r.slot-1]
	r.slot = 0
	s.busy = false
	// Copied: the caller owns r.BlockHashes and may reuse it.
	s.held = append(s.held[:0], r.BlockHashes[:min(blocks, len(r.BlockHashes))]...)
}

// commonPrefix is the number of leading elements a and b share.
func commonPrefix(a, b []uint64) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
