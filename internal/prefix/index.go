// Package prefix is the router's approximate picture of which backend holds
// which part of which prompt in its KV cache.
//
// A prompt is cut into fixed-size blocks of its canonical text, and each
// block is named by a hash chained over every block before it, so equal
// hashes mean equal text up to the end of that block, as with the engines'
// own prefix caching. Per backend, the index remembers the blocks it
// probably holds, most recently used first, bounded by that backend's KV
// capacity: what the engine would have evicted, the index forgets too.
package prefix

import (
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/hashtab"
)

// DefaultBlockBytes is the default block size in bytes of text: about 64
// tokens of English, four vLLM blocks.
const DefaultBlockBytes = 256

// Hash appends to dst the chained hashes of the full blockBytes-sized
// blocks of prompt. A partial last block gets no hash: no engine can reuse
// it either.
func Hash(dst []uint64, prompt string, blockBytes int) []uint64 {
	if blockBytes <= 0 {
		return dst
	}
	var d xxhash.Digest
	var parent [8]byte
	for start := 0; start+blockBytes <= len(prompt); start += blockBytes {
		d.Reset()
		d.Write(parent[:])
		d.WriteString(prompt[start : start+blockBytes])
		h := d.Sum64()
		for i := range parent {
			parent[i] = byte(h >> (8 * i))
		}
		dst = append(dst, h)
	}
	return dst
}

// Index maps block hashes to the backends that probably hold them. It is
// safe for concurrent use; every method takes one short lock.
//
// Blocks live in a slab, found by hash through a hashtab.Table, and are
// reused with their holder lists when forgotten: an index at a thousand
// backends remembers millions of blocks and replaces them all the time,
// and neither a Go map (slow once it has seen many deletions) nor a heap
// object per block (work for the garbage collector) keeps up.
//
// An index may keep one or two tiers, each an LRU list per backend with
// its own capacity, over one table of blocks: a policy that remembers a
// backend's blocks at two horizons (what it surely holds, and what it held
// lately) looks each block up once, not once per horizon. The methods
// without a tier in their name work on tier 0.
//
// An insertion puts a block at the head of every tier, so each tier's
// order is the order of the blocks' last insertion and the tiers of a
// backend agree on the order of the blocks they share. They are therefore
// one list per backend, each entry marked with the tiers it is in, and each
// tier has its own tail (its least recently used entry): a block in both
// tiers costs one entry, moved once when inserted again, not two; evicted
// from the smaller tier, it only loses a mark.
type Index struct {
	mu     sync.Mutex
	byHash hashtab.Table // block hash → index in blocks
	blocks []block
	unused []int32 // indexes of blocks no backend holds
	lists  []list  // per backend: its blocks in any tier
	tiers  [][]lru // per tier, per backend
	// capacities are each tier's capacity for a backend Grow adds.
	capacities []int
	// held finds a hot block's entry in a backend's list by (block,
	// backend, tier) (pairKey): a system prompt's first block is held by
	// every backend in every tier, and at ten thousand backends a scan of its holders for each
	// refresh, forget or match of one backend costs more than the rest of
	// a decision. Only hot blocks are in it: one entry per holder of
	// every block would double the index's memory for blocks one or two
	// backends hold.
	held hashtab.Table
	bis  []int32 // MatchFew's scratch
	sink uint64  // what prefetch read, kept so that the reads are not dropped
	// more are the holder lists of blocks with more than two holders;
	// spare lists those not in use, with their memory.
	more  [][]holder
	spare []int32
}

// maxTiers bounds an index's tiers: an entry keeps a holder slot per tier.
const maxTiers = 2

// block is one prompt block and the backends holding it: up to two in the
// block itself (most blocks are held by one backend, in both tiers), more
// in a list of Index.more. Blocks hold no pointers: at ten thousand
// backends there are tens of millions of them, and a holder list each
// doubled their memory and gave the garbage collector all of it to scan.
type block struct {
	hash   uint64
	inline [2]holder
	more   int32 // 1 + its list in Index.more; 0: the holders are inline
	n      uint8 // inline holders
	hot    bool  // its holders are in Index.held
}

// A block becomes hot with more than hotHolders holders, and cold again
// with fewer than half as many (not at the same count, so that a block
// around the threshold does not move in and out of held).
const hotHolders = 16

// holder is one backend's claim on a block in one tier: a block in both
// tiers of a backend has two holders, which name the same entry.
type holder struct {
	backend int32
	tier    int32
	node    int32 // the block's entry in that backend's list
}

// list is one backend's blocks in any of its tiers, most recently used at
// the head.
type list struct {
	nodes []node
	head  int32
	free  int32 // a list of unused nodes, linked by next
}

// lru is one backend's blocks in one tier: the entries of its list marked
// with the tier.
type lru struct {
	capacity int
	size     int
	tail     int32 // the tier's least recently used entry
}

type node struct {
	b int32 // index in Index.blocks
	// slot is, per tier, the block's holder's index in its holders, or
	// notIn if the backend does not hold it in that tier.
	slot       [maxTiers]int32
	prev, next int32
}

const (
	nilNode int32 = -1
	notIn   int32 = -1
)

// New returns an empty index for backends numbered 0..n-1, each holding at
// most capacity blocks until SetCapacity says otherwise.
func New(n, capacity int) *Index { return NewTiered(n, capacity) }

// NewTiered returns an empty index for backends numbered 0..n-1 with one
// tier per capacity (one or two): each backend holds at most
// capacities[t] blocks in tier t until SetTierCapacity says otherwise.
func NewTiered(n int, capacities ...int) *Index {
	if len(capacities) < 1 || len(capacities) > maxTiers {
		panic("prefix: an index has one or two tiers")
	}
	ix := &Index{tiers: make([][]lru, len(capacities)), capacities: capacities}
	ix.grow(n)
	return ix
}

func newList() list { return list{head: nilNode, free: nilNode} }

func newLRU(capacity int) lru { return lru{capacity: max(capacity, 1), tail: nilNode} }

// Backends returns how many backends the index has room for: they are
// numbered 0..Backends()-1.
func (ix *Index) Backends() int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return len(ix.lists)
}

// Grow makes room for backends numbered up to n-1, each new one empty with
// the capacities the index was made with. It never shrinks the index.
// Match's matched slices must then have n entries to see the new backends'
// blocks (a shorter one ignores them).
func (ix *Index) Grow(n int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.grow(n)
}

func (ix *Index) grow(n int) {
	for len(ix.lists) < n {
		ix.lists = append(ix.lists, newList())
		for t := range ix.tiers {
			ix.tiers[t] = append(ix.tiers[t], newLRU(ix.capacities[t]))
		}
	}
}

// Clear forgets every block backend holds, in every tier, and frees its
// list's memory: the backend has left the fleet. Its capacities are kept.
func (ix *Index) Clear(backend int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if backend < 0 || backend >= len(ix.lists) {
		return
	}
	for t := range ix.tiers {
		l := &ix.tiers[t][backend]
		for l.size > 0 {
			ix.evictTail(t, backend)
		}
		*l = newLRU(l.capacity)
	}
	ix.lists[backend] = newList()
}

// SetCapacity bounds backend's blocks, forgetting its least recently used
// ones beyond the bound.
func (ix *Index) SetCapacity(backend, capacity int) { ix.SetTierCapacity(0, backend, capacity) }

// SetTierCapacity is SetCapacity in tier t.
func (ix *Index) SetTierCapacity(t, backend, capacity int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	l := &ix.tiers[t][backend]
	l.capacity = max(capacity, 1)
	for l.size > l.capacity {
		ix.evictTail(t, backend)
	}
}

// Capacity returns backend's bound in blocks.
func (ix *Index) Capacity(backend int) int { return ix.TierCapacity(0, backend) }

// TierCapacity returns backend's bound in blocks in tier t.
func (ix *Index) TierCapacity(t, backend int) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.tiers[t][backend].capacity
}

// Len returns how many blocks backend holds in the index.
func (ix *Index) Len(backend int) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.tiers[0][backend].size
}

// Match sets matched[t][b] to the number of leading blocks of hashes that
// backend b holds in tier t, for every backend (each slice has one entry
// per backend) and the first len(matched) tiers, and returns the longest
// match in tier 0. It stops reading hashes as soon as no backend can match
// further, so a prompt nobody holds costs one lookup.
func (ix *Index) Match(hashes []uint64, matched ...[]int) int {
	for _, m := range matched {
		clear(m)
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	longest := 0
	for i, h := range hashes {
		bi, ok := ix.byHash.Get(h)
		if !ok {
			break
		}
		alive := false
		for _, hd := range ix.holders(bi) {
			if int(hd.tier) >= len(matched) {
				continue
			}
			if m := matched[hd.tier]; int(hd.backend) < len(m) && m[hd.backend] == i {
				m[hd.backend] = i + 1
				alive = true
				if hd.tier == 0 {
					longest = i + 1
				}
			}
		}
		if !alive {
			break
		}
	}
	return longest
}

// Insert records that backend now holds every block of hashes (it has just
// computed or reused them), as its most recently used, in every tier.
func (ix *Index) Insert(backend int, hashes []uint64) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.prefetch(backend, hashes)
	// Touch in reverse so that the prompt's first block ends up most
	// recent: engines evict a sequence's tail first, and a shared prefix
	// outlives the tails that hang off it.
	for i := len(hashes) - 1; i >= 0; i-- {
		ix.touch(backend, hashes[i])
	}
}

// prefetch reads, changing nothing, what inserting hashes for backend will
// most likely touch: each hash's slot in byHash and its block, and the
// blocks at the tail of each of backend's tiers (the ones a full tier
// evicts) with their slots. At a thousand backends each of these is a
// cache miss; one after another, each touch waits for its own, while
// these loads do not depend on each other and the processor overlaps them.
func (ix *Index) prefetch(backend int, hashes []uint64) {
	var sum uint64
	news := 0
	for _, h := range hashes {
		if bi, ok := ix.byHash.Get(h); ok {
			sum += ix.blocks[bi].hash
		} else {
			news++
		}
	}
	l := &ix.lists[backend]
	for t := range ix.tiers {
		n := ix.tiers[t][backend].tail
		for k := min(news, ix.tiers[t][backend].size); k > 0 && n != nilNode; n = l.nodes[n].prev {
			if l.nodes[n].slot[t] == notIn {
				continue
			}
			k--
			b := &ix.blocks[l.nodes[n].b]
			if b.n == 1 && b.more == 0 { // its last holder: the slot goes too
				v, _ := ix.byHash.Get(b.hash)
				sum += uint64(v)
			}
		}
	}
	ix.sink = sum
}

// Forget removes backend's claim on hashes[from:]: it turned out not to
// hold them.
func (ix *Index) Forget(backend int, hashes []uint64, from int) {
	ix.ForgetTier(0, backend, hashes, from)
}

// ForgetTier is Forget in tier t.
func (ix *Index) ForgetTier(t, backend int, hashes []uint64, from int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, h := range hashes[min(from, len(hashes)):] {
		bi, ok := ix.byHash.Get(h)
		if !ok {
			continue
		}
		if n, ok := ix.holds(bi, backend, t); ok {
			ix.remove(t, backend, n)
		}
	}
}

// touch makes h the most recently used block of backend in every tier,
// adding it where new. Tier by tier, in the order of two separate lists
// (a tier's eviction, then its holder), so that every block's holders
// stay in the order they always had: it decides which backends MatchFew
// adds.
func (ix *Index) touch(backend int, h uint64) {
	bi, ok := ix.byHash.Get(h)
	l := &ix.lists[backend]
	n := nilNode
	if ok {
		n = ix.entry(bi, backend)
	}
	for t := range ix.tiers {
		tl := &ix.tiers[t][backend]
		if n != nilNode && l.nodes[n].slot[t] != notIn {
			ix.toHead(backend, n)
			continue
		}
		if tl.size >= tl.capacity {
			// Never n's tier-t entry: it has none.
			ix.evictTail(t, backend)
		}
		if !ok {
			bi, ok = ix.newBlock(h), true
		}
		if n == nilNode {
			n = l.alloc(bi)
			l.pushHead(n)
		} else {
			ix.toHead(backend, n)
		}
		if tl.size == 0 {
			tl.tail = n
		}
		tl.size++
		l.nodes[n].slot[t] = ix.addHolder(bi, holder{backend: int32(backend), tier: int32(t), node: n})
		switch {
		case ix.blocks[bi].hot:
			ix.held.Insert(ix.pairKey(bi, backend, t), n)
		case len(ix.holders(bi)) > hotHolders:
			ix.setHot(bi, true)
		}
	}
}

// toHead moves entry n of backend's list to the head. A tier whose tail it
// was gets the next entry of that tier toward the head as its tail, if it
// has one.
func (ix *Index) toHead(backend int, n int32) {
	l := &ix.lists[backend]
	if l.head == n {
		return
	}
	for t := range ix.tiers {
		if tl := &ix.tiers[t][backend]; tl.tail == n {
			if m := l.newer(n, t); m != nilNode {
				tl.tail = m
			}
		}
	}
	l.unlink(n)
	l.pushHead(n)
}

// holds returns the entry of block bi in backend's list, if it holds it
// in tier t.
func (ix *Index) holds(bi int32, backend, t int) (int32, bool) {
	if ix.blocks[bi].hot {
		return ix.held.Get(ix.pairKey(bi, backend, t))
	}
	for _, hd := range ix.holders(bi) {
		if int(hd.backend) == backend && int(hd.tier) == t {
			return hd.node, true
		}
	}
	return 0, false
}

// entry returns the entry of block bi in backend's list, in any tier, or
// nilNode.
func (ix *Index) entry(bi int32, backend int) int32 {
	if ix.blocks[bi].hot {
		for t := range ix.tiers {
			if n, ok := ix.held.Get(ix.pairKey(bi, backend, t)); ok {
				return n
			}
		}
		return nilNode
	}
	for _, hd := range ix.holders(bi) {
		if int(hd.backend) == backend {
			return hd.node
		}
	}
	return nilNode
}

// pairKey names (block bi, backend, tier t) in held.
func (ix *Index) pairKey(bi int32, backend, t int) uint64 {
	return uint64(bi)<<32 | uint64(backend*len(ix.tiers)+t)
}

// setHot puts every holder of block bi into held, or takes them out.
func (ix *Index) setHot(bi int32, hot bool) {
	ix.blocks[bi].hot = hot
	for _, hd := range ix.holders(bi) {
		k := ix.pairKey(bi, int(hd.backend), int(hd.tier))
		if hot {
			ix.held.Insert(k, hd.node)
		} else {
			ix.held.Delete(k)
		}
	}
}

// newBlock returns the index of a block for h that no backend holds,
// reusing a forgotten one and its holder list's memory.
func (ix *Index) newBlock(h uint64) int32 {
	var bi int32
	if n := len(ix.unused); n > 0 {
		bi = ix.unused[n-1]
		ix.unused = ix.unused[:n-1]
		ix.blocks[bi] = block{hash: h}
	} else {
		bi = int32(len(ix.blocks))
		if len(ix.blocks) == cap(ix.blocks) {
			// Doubled, not by append's quarter: at a thousand backends
			// the slab reaches millions of blocks, and each step copies
			// it all into fresh memory, page by page.
			ix.blocks = slices.Grow(ix.blocks, max(len(ix.blocks), 64))
		}
		ix.blocks = append(ix.blocks, block{hash: h})
	}
	ix.byHash.Insert(h, bi)
	return bi
}

func (ix *Index) evictTail(t, backend int) {
	ix.remove(t, backend, ix.tiers[t][backend].tail)
}

// remove takes tier t from entry n (a block) of backend's list, the entry
// from the list if that was its last tier, and the holder from the block's
// holders.
func (ix *Index) remove(t, backend int, n int32) {
	l, tl := &ix.lists[backend], &ix.tiers[t][backend]
	bi, i := l.nodes[n].b, l.nodes[n].slot[t]
	l.nodes[n].slot[t] = notIn
	tl.size--
	if tl.tail == n {
		tl.tail = l.newer(n, t)
	}
	b := &ix.blocks[bi]
	if b.hot {
		ix.held.Delete(ix.pairKey(bi, backend, t))
	}
	if !l.nodes[n].inAny() {
		l.unlink(n)
		l.release(n)
	}
	// The last holder takes the removed one's slot (a shared prefix's
	// block has a holder per backend and tier: no scan for it).
	hs := ix.holders(bi)
	last := int32(len(hs) - 1)
	if i != last {
		moved := hs[last]
		hs[i] = moved
		ix.lists[moved.backend].nodes[moved.node].slot[moved.tier] = i
	}
	if b.more > 0 {
		ix.more[b.more-1] = hs[:last]
	} else {
		b.n--
	}
	if b.hot && last < hotHolders/2 {
		ix.setHot(bi, false)
	}
	if last == 0 {
		if b.more > 0 {
			ix.spare = append(ix.spare, b.more-1)
			b.more = 0
		}
		ix.byHash.Delete(b.hash)
		ix.unused = append(ix.unused, bi)
	}
}

// holders returns block bi's holders, in place: valid until the next
// change of the index.
func (ix *Index) holders(bi int32) []holder {
	b := &ix.blocks[bi]
	if b.more > 0 {
		return ix.more[b.more-1]
	}
	return b.inline[:b.n]
}

// addHolder adds h to block bi's holders and returns its slot there. A
// third holder moves the block's holders to a list of their own.
func (ix *Index) addHolder(bi int32, h holder) int32 {
	b := &ix.blocks[bi]
	if b.more == 0 && int(b.n) < len(b.inline) {
		b.inline[b.n] = h
		b.n++
		return int32(b.n - 1)
	}
	if b.more == 0 {
		var k int32
		if n := len(ix.spare); n > 0 {
			k = ix.spare[n-1]
			ix.spare = ix.spare[:n-1]
		} else {
			k = int32(len(ix.more))
			ix.more = append(ix.more, nil)
		}
		ix.more[k] = append(ix.more[k][:0], b.inline[:b.n]...)
		b.more, b.n = k+1, 0
	}
	l := &ix.more[b.more-1]
	*l = append(*l, h)
	return int32(len(*l) - 1)
}
