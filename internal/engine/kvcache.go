package engine

import (
	"math/bits"

	"github.com/kvroute/kvroute/internal/hashtab"
)

// kvCache is vLLM's paged KV cache with automatic prefix caching: a fixed
// pool of blocks; a full block is published under the chained hash of its
// content so later requests with the same prefix reuse it; blocks no request
// holds stay cached in an LRU free queue and are evicted only when a new block
// is needed. Not safe for concurrent use.
//
// Published blocks are found through a blockIndex: with small blocks, one
// table entry for each run of consecutive blocks of a sequence, not one per
// block. Which block is published, found and evicted, and when, is exactly
// as with one entry per block.
type kvCache struct {
	blocks []kvBlock
	// The free queue: every block with ref 0, least recently used first,
	// in the order they were freed: a ring of block numbers, entry s (a
	// count of pushes) at ring[s&mask], the queue's entries those from head
	// to tail. A block that leaves the queue from the middle (a prefix hit)
	// leaves its entry behind, stale: an entry is the block's place in the
	// queue only if the block is free and was last pushed as that entry
	// (kvBlock.pos), and allocate skips the others. A linked list cost
	// every block that left it two cache misses on its neighbours, and an
	// allocation of n blocks a chain of n dependent misses; here the ring
	// is read in order, and taking or freeing a block touches only it.
	ring       []int32
	mask       uint32
	head, tail uint32
	// compactions counts the times grow dropped stale entries (tests).
	compactions int
	free        int
	published   blockIndex // block hash → block
	// found are the blocks the last lookup found, for take.
	found []int32
	// evicted, when set, hears the hash of every published block that
	// allocate evicts (vLLM's BlockRemoved).
	evicted func(hash uint64)
}

// kvBlock is one block's state in one place: a fleet of simulated engines
// holds tens of millions of blocks, and allocating or evicting one touches
// all of its fields, so side by side they cost one cache miss, not one per
// field.
type kvBlock struct {
	hash uint64 // content hash of a published block
	ref  int32  // requests holding the block
	pos  uint32 // the free queue's entry it was last pushed as
	at   int32  // where it is published (blockIndex.insert), or hashtab.Absent
}

func newKVCache(blocks, blockSize int) *kvCache {
	// Room for a quarter as many stale entries as blocks, at least, before
	// the ring grows (which few engines' do).
	n := 1 << bits.Len(uint(blocks+blocks/4))
	c := &kvCache{
		blocks:    make([]kvBlock, blocks),
		ring:      make([]int32, n),
		mask:      uint32(n - 1),
		published: newBlockIndex(blocks, blockSize),
	}
	for b := range blocks {
		c.blocks[b].at = hashtab.Absent
		c.pushTail(int32(b))
	}
	return c
}

func (c *kvCache) total() int { return len(c.blocks) }

func (c *kvCache) used() int { return len(c.blocks) - c.free }

func (c *kvCache) pushTail(b int32) {
	if c.tail-c.head == uint32(len(c.ring)) {
		c.grow()
	}
	c.ring[c.tail&c.mask] = b
	c.blocks[b].pos = c.tail
	c.tail++
	c.free++
}

// unlink takes b, which has ref 0, out of the free queue: its entry
// goes stale when the caller holds it (ref > 0).
func (c *kvCache) unlink(int32) { c.free-- }

// popHead takes the least recently used free block out of the queue,
// skipping stale entries. The caller checks c.free > 0 first, and holds
// the block before the next push.
func (c *kvCache) popHead() int32 {
	for {
		s := c.head
		b := c.ring[s&c.mask]
		c.head++
		if k := &c.blocks[b]; k.ref == 0 && k.pos == s {
			c.free--
			return b
		}
	}
}

// grow makes room in a full ring. When stale entries are half of it or
// more, it drops them, the others keeping their order (renumbered from
// head, as their blocks' pos): else the ring would grow with every prefix
// hit on a free block until allocations reach its entry, which on a hot
// prefix and a large, little-evicted cache is without bound. Else it
// doubles the ring, its entries keeping their numbers. Either way it
// costs the ring's length once per at least half as many pushes.
func (c *kvCache) grow() {
	if int(c.tail-c.head)-c.free >= len(c.ring)/2 {
		w := c.head
		for s := c.head; s != c.tail; s++ {
			b := c.ring[s&c.mask]
			if k := &c.blocks[b]; k.ref == 0 && k.pos == s {
				c.ring[w&c.mask] = b // w ≤ s: read before overwritten
				k.pos = w
				w++
			}
		}
		c.tail = w
		c.compactions++
		return
	}
	ring := make([]int32, 2*len(c.ring))
	mask := uint32(len(ring) - 1)
	for s := c.head; s != c.tail; s++ {
		ring[s&mask] = c.ring[s&c.mask]
	}
	c.ring, c.mask = ring, mask
}

// lookup returns how many leading hashes (a sequence's, from its first
// block) name published blocks, and how many of those no request holds (they
// leave the free queue when taken). It remembers the blocks for take.
func (c *kvCache) lookup(hashes []uint64) (hits, idle int) {
	c.found = c.found[:0]
	cur := hashtab.NewCursor()
	for i := range hashes {
		b, ok := c.published.get(&cur, hashes, i)
		if !ok {
			break
		}
		c.found = append(c.found, b)
		if c.blocks[b].ref == 0 {
			idle++
		}
	}
	return len(c.found), idle
}

// take appends the first n blocks the last lookup found to dst, holding
// each. The cache must not have changed since that lookup.
func (c *kvCache) take(dst []int32, n int) []int32 {
	for _, b := range c.found[:n] {
		if c.blocks[b].ref == 0 {
			c.unlink(b)
		}
		c.blocks[b].ref++
		dst = append(dst, b)
	}
	return dst
}

// allocate appends n new blocks to dst, evicting the least recently used
// cached blocks. The caller checks c.free >= n first.
func (c *kvCache) allocate(dst []int32, n int) ([]int32, int) {
	evicted := 0
	for range n {
		b := c.popHead()
		k := &c.blocks[b]
		if k.at != hashtab.Absent {
			c.published.remove(k.at, k.hash)
			k.at = hashtab.Absent
			evicted++
			if c.evicted != nil {
				c.evicted(k.hash)
			}
		}
		k.ref = 1
		dst = append(dst, b)
	}
	return dst, evicted
}

// publish makes block b, block i of a sequence with block hashes hashes,
// findable under hashes[i], unless another block already is (two requests
// computed the same block at once): then b stays private. It reports
// whether b was published. cur is the run's cursor (hashtab.NewCursor at its
// start).
func (c *kvCache) publish(cur *hashtab.Cursor, b int32, hashes []uint64, i int) bool {
	at := c.published.insert(cur, hashes, i, b)
	if at == hashtab.Absent {
		return false
	}
	c.blocks[b].hash, c.blocks[b].at = hashes[i], at
	return true
}

// release drops one hold on each block. Blocks are released last first, so
// that of a freed sequence the tail (least likely shared) is evicted first.
func (c *kvCache) release(blocks []int32) {
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		c.blocks[b].ref--
		if c.blocks[b].ref == 0 {
			c.pushTail(b)
		}
	}
}
