package engine

import "github.com/kvroute/kvroute/internal/hashtab"

// kvCache is vLLM's paged KV cache with automatic prefix caching: a fixed
// pool of blocks; a full block is published under the chained hash of its
// content so later requests with the same prefix reuse it; blocks no request
// holds stay cached in an LRU free queue and are evicted only when a new block
// is needed. Not safe for concurrent use.
type kvCache struct {
	ref    []int32  // requests holding the block
	hash   []uint64 // content hash of a published block
	hashed []bool   // whether the block is published under hash
	// The free queue: every block with ref 0, least recently used first.
	prev, next []int32
	head, tail int32
	free       int
	byHash     hashtab.Table
	// evicted, when set, hears the hash of every published block that
	// allocate evicts (vLLM's BlockRemoved).
	evicted func(hash uint64)
}

const none int32 = -1

func newKVCache(blocks int) *kvCache {
	c := &kvCache{
		ref:    make([]int32, blocks),
		hash:   make([]uint64, blocks),
		hashed: make([]bool, blocks),
		prev:   make([]int32, blocks),
		next:   make([]int32, blocks),
		head:   none,
		tail:   none,
		byHash: hashtab.New(blocks),
	}
	for b := range blocks {
		c.pushTail(int32(b))
	}
	return c
}

func (c *kvCache) total() int { return len(c.ref) }

func (c *kvCache) used() int { return len(c.ref) - c.free }

func (c *kvCache) pushTail(b int32) {
	c.prev[b], c.next[b] = c.tail, none
	if c.tail == none {
		c.head = b
	} else {
		c.next[c.tail] = b
	}
	c.tail = b
	c.free++
}

func (c *kvCache) unlink(b int32) {
	p, n := c.prev[b], c.next[b]
	if p == none {
		c.head = n
	} else {
		c.next[p] = n
	}
	if n == none {
		c.tail = p
	} else {
		c.prev[n] = p
	}
	c.free--
}

// lookup returns how many leading hashes name published blocks, and how many
// of those no request holds (they leave the free queue when taken).
func (c *kvCache) lookup(hashes []uint64) (hits, idle int) {
	for _, h := range hashes {
		b, ok := c.byHash.Get(h)
		if !ok {
			break
		}
		hits++
		if c.ref[b] == 0 {
			idle++
		}
	}
	return hits, idle
}

// take appends the blocks published under the first n hashes (found by
// lookup) to dst, holding each.
func (c *kvCache) take(dst []int32, hashes []uint64) []int32 {
	for _, h := range hashes {
		b, _ := c.byHash.Get(h)
		if c.ref[b] == 0 {
			c.unlink(b)
		}
		c.ref[b]++
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
		if c.hashed[b] {
			c.byHash.DeleteIf(c.hash[b], b)
			c.hashed[b] = false
			evicted++
			if c.evicted != nil {
				c.evicted(c.hash[b])
			}
		}
		c.ref[b] = 1
		dst = append(dst, b)
	}
	return dst, evicted
}

// publish makes block b findable under h, unless another block already is
// (two requests computed the same block at once): then b stays private. It
// reports whether b was published.
func (c *kvCache) publish(b int32, h uint64) bool {
	if c.byHash.Insert(h, b) {
		c.hash[b], c.hashed[b] = h, true
		return true
	}
	return false
}

// release drops one hold on each block. Blocks are released last first, so
// that of a freed sequence the tail (least likely shared) is evicted first.
func (c *kvCache) release(blocks []int32) {
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		c.ref[b]--
		if c.ref[b] == 0 {
			c.pushTail(b)
		}
	}
}
