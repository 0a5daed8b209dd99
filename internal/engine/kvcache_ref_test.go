package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/internal/hashtab"
)

// refCache is the KV cache as vLLM describes it, block by block: the free
// queue a doubly linked list, published blocks in a Go map. It is the cache
// as it was before the queue became a slice with holes and the index found
// blocks by group, kept to check that kvCache changes nothing observable.
const none int32 = -1

type refCache struct {
	blocks     []refBlock
	head, tail int32
	free       int
	published  map[uint64]int32
	found      []int32
	evicted    []uint64
}

type refBlock struct {
	hash       uint64
	ref        int32
	prev, next int32
	isPub      bool
}

func newRefCache(blocks int) *refCache {
	c := &refCache{blocks: make([]refBlock, blocks), head: none, tail: none, published: map[uint64]int32{}}
	for b := range blocks {
		c.pushTail(int32(b))
	}
	return c
}

func (c *refCache) pushTail(b int32) {
	c.blocks[b].prev, c.blocks[b].next = c.tail, none
	if c.tail == none {
		c.head = b
	} else {
		c.blocks[c.tail].next = b
	}
	c.tail = b
	c.free++
}

func (c *refCache) unlink(b int32) {
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

func (c *refCache) lookup(hashes []uint64) (hits, idle int) {
	c.found = c.found[:0]
	for _, h := range hashes {
		b, ok := c.published[h]
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

func (c *refCache) take(dst []int32, n int) []int32 {
	for _, b := range c.found[:n] {
		if c.blocks[b].ref == 0 {
			c.unlink(b)
		}
		c.blocks[b].ref++
		dst = append(dst, b)
	}
	return dst
}

func (c *refCache) allocate(dst []int32, n int) []int32 {
	for range n {
		b := c.head
		c.unlink(b)
		k := &c.blocks[b]
		if k.isPub {
			delete(c.published, k.hash)
			k.isPub = false
			c.evicted = append(c.evicted, k.hash)
		}
		k.ref = 1
		dst = append(dst, b)
	}
	return dst
}

func (c *refCache) publish(b int32, h uint64) bool {
	if _, ok := c.published[h]; ok {
		return false
	}
	c.published[h] = b
	c.blocks[b].hash, c.blocks[b].isPub = h, true
	return true
}

func (c *refCache) release(blocks []int32) {
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		c.blocks[b].ref--
		if c.blocks[b].ref == 0 {
			c.pushTail(b)
		}
	}
}

// TestKVCacheMatchesReference drives kvCache and refCache with the same
// random sequences (prompts under a few shared prefixes, found, taken,
// grown block by block as decodes do, published, released and preempted)
// on a small cache, so that blocks are shared, evicted and freed from the
// middle of the queue all the time, and compares everything observable
// after every operation: the hits and idle blocks of each lookup, the
// blocks each allocation returns (so the free queue's order), the hashes it
// evicts in order, which publications take, and the counts.
func TestKVCacheMatchesReference(t *testing.T) {
	for _, bs := range []int{16, 512} {
		for seed := range uint64(4) {
			t.Run(fmt.Sprintf("block%d/seed%d", bs, seed), func(t *testing.T) {
				checkAgainstReference(t, bs, seed)
			})
		}
	}
}

func checkAgainstReference(t *testing.T, blockSize int, seed uint64) {
	const blocks = 256
	rng := rand.New(rand.NewPCG(seed, 77))
	c, ref := newKVCache(blocks, blockSize), newRefCache(blocks)
	small := seed%2 == 1
	if small {
		// The least ring that holds the blocks (entries 0 to 255 stay
		// where they are), so that stale entries make it grow.
		c.ring, c.mask = c.ring[:blocks:blocks], blocks-1
	}
	var evicted []uint64
	c.evicted = func(h uint64) { evicted = append(evicted, h) }

	type seqn struct {
		hashes []uint64
		blocks []int32 // c's
		refb   []int32 // ref's
	}
	var live []*seqn
	// A prompt: the first blocks of one of a few shared chains (some
	// parting ways inside a group of blocks), then blocks of its own.
	prompt := func() []uint64 {
		var ids []uint64
		root := uint64(rng.IntN(6))
		for k := range rng.IntN(60) {
			ids = append(ids, root<<32|uint64(k)|uint64(rng.IntN(1+k/20))<<40)
		}
		for range rng.IntN(30) {
			ids = append(ids, rng.Uint64())
		}
		var hs []uint64
		var parent uint64
		for _, id := range ids {
			parent = ChainHash(parent, id)
			hs = append(hs, parent)
		}
		return hs
	}
	publish := func(s *seqn, from, to int) {
		cur := hashtab.NewCursor()
		for i := from; i < to && i < len(s.hashes); i++ {
			got := c.publish(&cur, s.blocks[i], s.hashes, i)
			want := ref.publish(s.refb[i], s.hashes[i])
			if got != want {
				t.Fatalf("publish of block %d: %v, reference %v", i, got, want)
			}
		}
	}
	allocate := func(s *seqn, n int) {
		before := len(evicted)
		old := len(s.blocks)
		var ev int
		s.blocks, ev = c.allocate(s.blocks, n)
		s.refb = ref.allocate(s.refb, n)
		if !slices.Equal(s.blocks[old:], s.refb[old:]) {
			t.Fatalf("allocated %v, reference %v", s.blocks[old:], s.refb[old:])
		}
		if ev != len(evicted)-before || !slices.Equal(evicted[before:], ref.evicted[before:]) {
			t.Fatalf("evicted %d %v, reference %v", ev, evicted[before:], ref.evicted[before:])
		}
	}
	drop := func(i int) {
		s := live[i]
		c.release(s.blocks)
		ref.release(s.refb)
		live = slices.Delete(live, i, i+1)
	}
	for op := range 20_000 {
		switch r := rng.IntN(100); {
		case r < 40: // admit a prompt: its cached prefix, then new blocks
			s := &seqn{hashes: prompt()}
			hits, idle := c.lookup(s.hashes)
			rh, ri := ref.lookup(s.hashes)
			if hits != rh || idle != ri {
				t.Fatalf("op %d: lookup %d hits, %d idle; reference %d, %d", op, hits, idle, rh, ri)
			}
			hits = rng.IntN(hits + 1) // as admit keeps the last block to compute
			need := len(s.hashes) - hits + rng.IntN(3)
			if c.free-idle < need {
				continue
			}
			s.blocks = c.take(nil, hits)
			s.refb = ref.take(nil, hits)
			if !slices.Equal(s.blocks, s.refb) {
				t.Fatalf("op %d: took %v, reference %v", op, s.blocks, s.refb)
			}
			allocate(s, need)
			publish(s, hits, len(s.hashes))
			live = append(live, s)
		case r < 50 && len(live) > 0: // a prompt found whole, taking no new block
			s := &seqn{hashes: slices.Clone(live[rng.IntN(len(live))].hashes)}
			hits, idle := c.lookup(s.hashes)
			rh, ri := ref.lookup(s.hashes)
			if hits != rh || idle != ri {
				t.Fatalf("op %d: lookup %d hits, %d idle; reference %d, %d", op, hits, idle, rh, ri)
			}
			s.hashes = s.hashes[:hits]
			s.blocks, s.refb = c.take(nil, hits), ref.take(nil, hits)
			live = append(live, s)
		case r < 60 && len(live) > 0: // a decode completes a block
			s := live[rng.IntN(len(live))]
			if c.free == 0 {
				continue
			}
			allocate(s, 1)
			if n := len(s.hashes); n == len(s.blocks)-1 && n > 0 {
				// The block is full: it gets its hash and is published.
				s.hashes = append(s.hashes, ChainHash(s.hashes[n-1], rng.Uint64()))
				publish(s, n, n+1)
			}
		case r < 95 && len(live) > 0: // a request finishes or is preempted
			drop(rng.IntN(len(live)))
		case len(live) > 0: // all of them
			for len(live) > 0 {
				drop(len(live) - 1)
			}
		}
		if c.free != ref.free || c.used() != blocks-ref.free || c.published.len() != len(ref.published) {
			t.Fatalf("op %d: %d free, %d published; reference %d, %d", op, c.free, c.published.len(), ref.free, len(ref.published))
		}
	}
	if small && len(c.ring) == blocks {
		t.Error("the ring never grew: the test does not reach that path")
	}
	if len(evicted) < 1000 {
		t.Fatalf("only %d evictions: the test does not exercise the queue", len(evicted))
	}
}

// A hot block on a cache that never fills: every hit on it while free
// leaves a stale entry that no allocation reaches. The ring drops them
// instead of growing with every hit, and the queue keeps its order.
func TestRingDropsStaleEntries(t *testing.T) {
	const blocks, hot = 64, 5
	c := newKVCache(blocks, 16)
	size := len(c.ring)
	for range 100_000 {
		c.unlink(hot) // a hit: held, its entry stale
		c.blocks[hot].ref = 1
		c.blocks[hot].ref = 0 // released: freed again, the newest
		c.pushTail(hot)
	}
	if len(c.ring) > 2*size || c.compactions == 0 {
		t.Fatalf("ring of %d entries (from %d), %d compactions: want it bounded by dropping stale entries", len(c.ring), size, c.compactions)
	}
	var got []int32
	for c.free > 0 {
		b := c.popHead()
		c.blocks[b].ref = 1
		got = append(got, b)
	}
	var want []int32
	for b := range int32(blocks) {
		if b != hot {
			want = append(want, b)
		}
	}
	want = append(want, hot)
	if !slices.Equal(got, want) {
		t.Errorf("free queue order %v, want %v", got, want)
	}
}
