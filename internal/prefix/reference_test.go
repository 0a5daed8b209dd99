package prefix

import (
	"slices"
	"sync"

	"github.com/kvroute/kvroute/internal/hashtab"
)

// The index as it was before its tiers shared one list per backend (two
// lists, one refNode per tier), kept to check that the shared list changes
// nothing: not the blocks matched, not the order of any refBlock's holders
// (which decides the backends MatchFew adds).

type refIndex struct {
	mu     sync.Mutex
	byHash hashtab.Table // refBlock hash → index in blocks
	blocks []refBlock
	unused []int32    // indexes of blocks no backend holds
	tiers  [][]refLRU // per tier, per backend
	// capacities are each tier's capacity for a backend Grow adds.
	capacities []int
	// held finds a hot refBlock's refHolder by (refBlock, backend, tier) (pairKey):
	// a system prompt's first refBlock is held by every backend in every
	// tier, and at ten thousand backends a scan of its holders for each
	// refresh, forget or match of one backend costs more than the rest of
	// a decision. Only hot blocks are in it: one entry per refHolder of
	// every refBlock would double the index's memory for blocks one or two
	// backends hold.
	held hashtab.Table
	bis  []int32 // MatchFew's scratch
	sink uint64  // what prefetch read, kept so that the reads are not dropped
	// more are the refHolder lists of blocks with more than two holders;
	// spare lists those not in use, with their memory.
	more  [][]refHolder
	spare []int32
}

// refBlock is one prompt refBlock and the backends holding it: up to two in the
// refBlock itself (most blocks are held by one backend, in both tiers), more
// in a list of refIndex.more. Blocks hold no pointers: at ten thousand
// backends there are tens of millions of them, and a refHolder list each
// doubled their memory and gave the garbage collector all of it to scan.
type refBlock struct {
	hash   uint64
	inline [2]refHolder
	more   int32 // 1 + its list in refIndex.more; 0: the holders are inline
	n      uint8 // inline holders
	hot    bool  // its holders are in refIndex.held
}

type refHolder struct {
	backend int32
	tier    int32
	refNode int32 // the refBlock's refNode in that backend's LRU list of the tier
}

// refLRU is one backend's blocks in one tier, most recently used at the head.
type refLRU struct {
	capacity   int
	nodes      []refNode
	head, tail int32
	free       int32 // a list of unused nodes, linked by next
	size       int
}

type refNode struct {
	b          int32 // index in refIndex.blocks
	slot       int32 // its refHolder's index in the refBlock's holders
	prev, next int32
}

// newRefTiered returns an empty index for backends numbered 0..n-1 with one
// tier per capacity: each backend holds at most capacities[t] blocks in
// tier t until SetTierCapacity says otherwise.
func newRefTiered(n int, capacities ...int) *refIndex {
	ix := &refIndex{tiers: make([][]refLRU, len(capacities)), capacities: capacities}
	for t, c := range capacities {
		ix.tiers[t] = make([]refLRU, n)
		for i := range ix.tiers[t] {
			ix.tiers[t][i] = newRefLRU(c)
		}
	}
	return ix
}

func newRefLRU(capacity int) refLRU {
	return refLRU{capacity: max(capacity, 1), head: nilNode, tail: nilNode, free: nilNode}
}

// Backends returns how many backends the index has room for: they are
// numbered 0..Backends()-1.
func (ix *refIndex) Backends() int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return len(ix.tiers[0])
}

// Grow makes room for backends numbered up to n-1, each new one empty with
// the capacities the index was made with. It never shrinks the index.
// Match's matched slices must then have n entries to see the new backends'
// blocks (a shorter one ignores them).
func (ix *refIndex) Grow(n int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for t := range ix.tiers {
		for len(ix.tiers[t]) < n {
			ix.tiers[t] = append(ix.tiers[t], newRefLRU(ix.capacities[t]))
		}
	}
}

// Clear forgets every refBlock backend holds, in every tier, and frees its
// lists' memory: the backend has left the fleet. Its capacities are kept.
func (ix *refIndex) Clear(backend int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if backend < 0 || backend >= len(ix.tiers[0]) {
		return
	}
	for t := range ix.tiers {
		l := &ix.tiers[t][backend]
		for l.size > 0 {
			ix.evictTail(t, backend)
		}
		*l = newRefLRU(l.capacity)
	}
}

// SetCapacity bounds backend's blocks, forgetting its least recently used
// ones beyond the bound.
func (ix *refIndex) SetCapacity(backend, capacity int) { ix.SetTierCapacity(0, backend, capacity) }

// SetTierCapacity is SetCapacity in tier t.
func (ix *refIndex) SetTierCapacity(t, backend, capacity int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	l := &ix.tiers[t][backend]
	l.capacity = max(capacity, 1)
	for l.size > l.capacity {
		ix.evictTail(t, backend)
	}
}

// Capacity returns backend's bound in blocks.
func (ix *refIndex) Capacity(backend int) int { return ix.TierCapacity(0, backend) }

// TierCapacity returns backend's bound in blocks in tier t.
func (ix *refIndex) TierCapacity(t, backend int) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.tiers[t][backend].capacity
}

// Len returns how many blocks backend holds in the index.
func (ix *refIndex) Len(backend int) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.tiers[0][backend].size
}

// Match sets matched[t][b] to the number of leading blocks of hashes that
// backend b holds in tier t, for every backend (each slice has one entry
// per backend) and the first len(matched) tiers, and returns the longest
// match in tier 0. It stops reading hashes as soon as no backend can match
// further, so a prompt nobody holds costs one lookup.
func (ix *refIndex) Match(hashes []uint64, matched ...[]int) int {
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

// Insert records that backend now holds every refBlock of hashes (it has just
// computed or reused them), as its most recently used, in every tier.
func (ix *refIndex) Insert(backend int, hashes []uint64) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.prefetch(backend, hashes)
	// Touch in reverse so that the prompt's first refBlock ends up most
	// recent: engines evict a sequence's tail first, and a shared prefix
	// outlives the tails that hang off it.
	for i := len(hashes) - 1; i >= 0; i-- {
		ix.touch(backend, hashes[i])
	}
}

// prefetch reads, changing nothing, what inserting hashes for backend will
// most likely touch: each hash's slot in byHash and its refBlock, and the
// blocks at the tail of backend's lists (the ones a full list evicts) with
// their slots. At a thousand backends each of these is a cache miss; one
// after another, each touch waits for its own, while these loads do not
// depend on each other and the processor overlaps them.
func (ix *refIndex) prefetch(backend int, hashes []uint64) {
	var sum uint64
	news := 0
	for _, h := range hashes {
		if bi, ok := ix.byHash.Get(h); ok {
			sum += ix.blocks[bi].hash
		} else {
			news++
		}
	}
	for t := range ix.tiers {
		l := &ix.tiers[t][backend]
		n := l.tail
		for range min(news, l.size) {
			b := &ix.blocks[l.nodes[n].b]
			if b.n == 1 && b.more == 0 { // its last refHolder: the slot goes too
				v, _ := ix.byHash.Get(b.hash)
				sum += uint64(v)
			}
			n = l.nodes[n].prev
		}
	}
	ix.sink = sum
}

// Forget removes backend's claim on hashes[from:]: it turned out not to
// hold them.
func (ix *refIndex) Forget(backend int, hashes []uint64, from int) {
	ix.ForgetTier(0, backend, hashes, from)
}

// ForgetTier is Forget in tier t.
func (ix *refIndex) ForgetTier(t, backend int, hashes []uint64, from int) {
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

// touch makes h the most recently used refBlock of backend in every tier,
// adding it where new.
func (ix *refIndex) touch(backend int, h uint64) {
	bi, ok := ix.byHash.Get(h)
	for t := range ix.tiers {
		l := &ix.tiers[t][backend]
		if ok && ix.refresh(l, bi, backend, t) {
			continue
		}
		if l.size >= l.capacity {
			// Not h's refBlock, if it exists: this backend does not hold it
			// in this tier.
			ix.evictTail(t, backend)
		}
		if !ok {
			bi, ok = ix.newBlock(h), true
		}
		n := l.alloc(bi)
		l.pushHead(n)
		l.size++
		l.nodes[n].slot = ix.addHolder(bi, refHolder{backend: int32(backend), tier: int32(t), refNode: n})
		switch {
		case ix.blocks[bi].hot:
			ix.held.Insert(ix.pairKey(bi, backend, t), n)
		case len(ix.holders(bi)) > hotHolders:
			ix.setHot(bi, true)
		}
	}
}

// refresh moves refBlock bi to the head of l, backend's list in tier t, and
// reports whether the backend held it there.
func (ix *refIndex) refresh(l *refLRU, bi int32, backend, t int) bool {
	n, ok := ix.holds(bi, backend, t)
	if ok {
		l.unlink(n)
		l.pushHead(n)
	}
	return ok
}

// holds returns the refNode of refBlock bi in backend's list of tier t, if it
// holds it there.
func (ix *refIndex) holds(bi int32, backend, t int) (int32, bool) {
	if ix.blocks[bi].hot {
		return ix.held.Get(ix.pairKey(bi, backend, t))
	}
	for _, hd := range ix.holders(bi) {
		if int(hd.backend) == backend && int(hd.tier) == t {
			return hd.refNode, true
		}
	}
	return 0, false
}

// pairKey names (refBlock bi, backend, tier t) in held.
func (ix *refIndex) pairKey(bi int32, backend, t int) uint64 {
	return uint64(bi)<<32 | uint64(backend*len(ix.tiers)+t)
}

// setHot puts every refHolder of refBlock bi into held, or takes them out.
func (ix *refIndex) setHot(bi int32, hot bool) {
	ix.blocks[bi].hot = hot
	for _, hd := range ix.holders(bi) {
		k := ix.pairKey(bi, int(hd.backend), int(hd.tier))
		if hot {
			ix.held.Insert(k, hd.refNode)
		} else {
			ix.held.Delete(k)
		}
	}
}

// newBlock returns the index of a refBlock for h that no backend holds,
// reusing a forgotten one and its refHolder list's memory.
func (ix *refIndex) newBlock(h uint64) int32 {
	var bi int32
	if n := len(ix.unused); n > 0 {
		bi = ix.unused[n-1]
		ix.unused = ix.unused[:n-1]
		ix.blocks[bi] = refBlock{hash: h}
	} else {
		bi = int32(len(ix.blocks))
		ix.blocks = append(ix.blocks, refBlock{hash: h})
	}
	ix.byHash.Insert(h, bi)
	return bi
}

func (ix *refIndex) evictTail(t, backend int) {
	ix.remove(t, backend, ix.tiers[t][backend].tail)
}

// remove drops refNode n (a refBlock) from backend's list in tier t and the
// refBlock's holders.
func (ix *refIndex) remove(t, backend int, n int32) {
	l := &ix.tiers[t][backend]
	bi, i := l.nodes[n].b, l.nodes[n].slot
	b := &ix.blocks[bi]
	if b.hot {
		ix.held.Delete(ix.pairKey(bi, backend, t))
	}
	l.unlink(n)
	l.release(n)
	l.size--
	// The last refHolder takes the removed one's slot (a shared prefix's
	// refBlock has a refHolder per backend and tier: no scan for it).
	hs := ix.holders(bi)
	last := int32(len(hs) - 1)
	if i != last {
		moved := hs[last]
		hs[i] = moved
		ix.tiers[moved.tier][moved.backend].nodes[moved.refNode].slot = i
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

// holders returns refBlock bi's holders, in place: valid until the next
// change of the index.
func (ix *refIndex) holders(bi int32) []refHolder {
	b := &ix.blocks[bi]
	if b.more > 0 {
		return ix.more[b.more-1]
	}
	return b.inline[:b.n]
}

// addHolder adds h to refBlock bi's holders and returns its slot there. A
// third refHolder moves the refBlock's holders to a list of their own.
func (ix *refIndex) addHolder(bi int32, h refHolder) int32 {
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

func (l *refLRU) alloc(b int32) int32 {
	if l.free != nilNode {
		n := l.free
		l.free = l.nodes[n].next
		l.nodes[n] = refNode{b: b, prev: nilNode, next: nilNode}
		return n
	}
	l.nodes = append(l.nodes, refNode{b: b, prev: nilNode, next: nilNode})
	return int32(len(l.nodes) - 1)
}

func (l *refLRU) release(n int32) {
	l.nodes[n] = refNode{b: -1, next: l.free, prev: nilNode}
	l.free = n
}

func (l *refLRU) pushHead(n int32) {
	l.nodes[n].prev, l.nodes[n].next = nilNode, l.head
	if l.head != nilNode {
		l.nodes[l.head].prev = n
	} else {
		l.tail = n
	}
	l.head = n
}

func (l *refLRU) unlink(n int32) {
	p, nx := l.nodes[n].prev, l.nodes[n].next
	if p != nilNode {
		l.nodes[p].next = nx
	} else {
		l.head = nx
	}
	if nx != nilNode {
		l.nodes[nx].prev = p
	} else {
		l.tail = p
	}
}
func (ix *refIndex) MatchFew(hashes []uint64, backends []int32, deepest int, matched ...[]int) ([]int32, int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	bis := ix.known(hashes)
	backends = ix.deepest(bis, backends, deepest, len(matched))
	longest := 0
	for _, b := range backends {
		for t, m := range matched {
			if int(b) >= len(m) {
				continue
			}
			n := 0
			for n < len(bis) {
				if _, ok := ix.holds(bis[n], int(b), t); !ok {
					break
				}
				n++
			}
			m[b] = n
			if t == 0 {
				longest = max(longest, n)
			}
		}
	}
	return backends, longest
}

// known returns the slab indexes of the leading blocks of hashes the index
// has, in a buffer reused by the next call. Call with mu held.
func (ix *refIndex) known(hashes []uint64) []int32 {
	ix.bis = ix.bis[:0]
	for _, h := range hashes {
		bi, ok := ix.byHash.Get(h)
		if !ok {
			break
		}
		ix.bis = append(ix.bis, bi)
	}
	return ix.bis
}

// deepest appends to backends up to want others holding blocks of bis in
// the first tiers tiers, from the deepest refBlock up. Call with mu held.
func (ix *refIndex) deepest(bis []int32, backends []int32, want, tiers int) []int32 {
	added := 0
	for i := len(bis) - 1; i >= 0 && added < want; i-- {
		for _, hd := range ix.holders(bis[i]) {
			if int(hd.tier) >= tiers || slices.Contains(backends, hd.backend) {
				continue
			}
			backends = append(backends, hd.backend)
			if added++; added == want {
				break
			}
		}
	}
	return backends
}
