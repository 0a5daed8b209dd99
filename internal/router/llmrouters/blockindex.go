package llmrouters

import (
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/router"
)

// blockIndex is a peer policy's approximate picture of the prompt blocks
// each backend holds: the prompts the policy itself sent there, in blocks of
// peerBlockBytes, forgotten least recently used first beyond the backend's
// KV capacity. It is how Dynamo's router without KV events (ApproxKvIndexer)
// and llm-d's approximate prefix-cache scorer see the fleet. Safe for
// concurrent use.
type blockIndex struct {
	index         *prefix.Index
	n             atomic.Int64 // backends indexed: 0..n-1 (setBackends grows it)
	defaultBlocks int

	mu       sync.Mutex
	info     []*fleet.Info // the Info each capacity was derived from
	capacity []int         // in blocks, by backend index
	live     []bool        // the backends in the fleet, by index

	scratch sync.Pool // *blockScratch
}

type blockScratch struct {
	hashes  []uint64
	matched []int
}

func newBlockIndex(backends []*fleet.Backend, defaultKVTokens int) *blockIndex {
	n := 0
	for _, b := range backends {
		n = max(n, b.Index+1)
	}
	x := &blockIndex{
		defaultBlocks: blocksOf(defaultKVTokens),
		info:          make([]*fleet.Info, n),
		capacity:      make([]int, n),
		live:          make([]bool, n),
	}
	x.n.Store(int64(n))
	x.index = prefix.New(n, x.defaultBlocks)
	for i := range x.capacity {
		x.capacity[i] = x.defaultBlocks
		x.live[i] = true
	}
	for _, b := range backends {
		x.capacityOf(b)
	}
	x.scratch.New = func() any { return &blockScratch{matched: make([]int, x.n.Load())} }
	return x
}

// setBackends is the peers' FleetWatcher: room for new backends' indexes,
// and removed backends' blocks forgotten.
func (x *blockIndex) setBackends(backends []*fleet.Backend) {
	x.mu.Lock()
	defer x.mu.Unlock()
	n := len(x.live)
	for _, b := range backends {
		n = max(n, b.Index+1)
	}
	for len(x.live) < n {
		x.info = append(x.info, nil)
		x.capacity = append(x.capacity, x.defaultBlocks)
		x.live = append(x.live, false)
	}
	x.index.Grow(n)
	want := make([]bool, n)
	for _, b := range backends {
		want[b.Index] = true
	}
	for i, live := range x.live {
		if live && !want[i] {
			x.index.Clear(i)
		}
		x.live[i] = want[i]
	}
	x.n.Store(int64(n))
}

// blocksOf converts a KV capacity in tokens into index blocks.
func blocksOf(tokens int) int { return max(1, int(float64(tokens)/peerBlockTokens)) }

// has reports whether b is one of the backends the index was built for.
func (x *blockIndex) has(b *fleet.Backend) bool { return b.Index >= 0 && int64(b.Index) < x.n.Load() }

// capacityOf returns b's capacity in blocks, first bringing the index's bound
// up to date with what b reports (discovery may come after construction).
func (x *blockIndex) capacityOf(b *fleet.Backend) int {
	if !x.has(b) {
		return x.defaultBlocks
	}
	info := b.Info()
	x.mu.Lock()
	defer x.mu.Unlock()
	if info != x.info[b.Index] {
		x.info[b.Index] = info
		c := x.defaultBlocks
		if info.KVTokens() > 0 {
			c = blocksOf(info.KVTokens())
		}
		if c != x.capacity[b.Index] {
			x.capacity[b.Index] = c
			x.index.SetCapacity(b.Index, c)
		}
	}
	return x.capacity[b.Index]
}

// match hashes req's prompt into s.hashes, sets s.matched to every
// backend's matched leading blocks and returns the longest match.
func (x *blockIndex) match(s *blockScratch, req *router.Request) int {
	if n := int(x.n.Load()); len(s.matched) < n { // the fleet grew
		s.matched = make([]int, n)
	}
	s.hashes = req.PrefixHashes(s.hashes[:0], peerBlockBytes)
	return x.index.Match(s.hashes, s.matched)
}

// matched returns b's matched blocks from the last match into s.
func (x *blockIndex) matched(s *blockScratch, b *fleet.Backend) int {
	if b.Index < 0 || b.Index >= len(s.matched) {
		return 0
	}
	return s.matched[b.Index]
}

// cachedTokens returns the tokens of a prompt of promptTokens that b holds
// according to the last match into s.
func (x *blockIndex) cachedTokens(s *blockScratch, b *fleet.Backend, promptTokens int) int {
	return min(promptTokens, int(float64(x.matched(s, b))*peerBlockTokens))
}

// insert records that b now holds hashes, most recently used.
func (x *blockIndex) insert(b *fleet.Backend, hashes []uint64) {
	if !x.has(b) {
		return
	}
	x.capacityOf(b)
	x.index.Insert(b.Index, hashes)
}

// held returns how many blocks b holds in the index.
func (x *blockIndex) held(b *fleet.Backend) int {
	if !x.has(b) {
		return 0
	}
	return x.index.Len(b.Index)
}

func (x *blockIndex) get() *blockScratch { return x.scratch.Get().(*blockScratch) }

func (x *blockIndex) put(s *blockScratch) { x.scratch.Put(s) }
