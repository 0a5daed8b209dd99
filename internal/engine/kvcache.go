package engine

import "github.com/kvroute/kvroute/internal/hashtab"

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
	// linked through kvBlock.prev and next.
	head, tail int32
	free       int
	published  blockIndex // block hash → block
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
	hash       uint64 // content hash of a published block
	ref        int32  // requests holding the block
	prev, next int32
	at         int32 // where it is published (blockIndex.insert), or hashtab.Absent
}

const none int32 = -1

func newKVCache(blocks, blockSize int) *kvCache {
	c := &kvCache{
		blocks:    make([]kvBlock, blocks),
		head:      none,
		tail:      none,
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
	c.blocks[b].prev, c.blocks[b].next = c.tail, none
	if c.tail == none {
		c.head = b
	} else {
		c.blocks[c.tail].next = b
	}
	c.tail = b
	c.free++
}

func (c *kvCache) unlink(b int32) {
	p, n := c.blocks[b].prev, c.blocks[b].next
	if p == none {
		c.head = n
	} else {
		c.blocks[p].next = n
	}
	if n == none {
		c.tail = p
	} else {
		c.blocks[n].prev = p
	}
	c.free--
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
		b := c.head
		c.unlink(b)
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
