package engine

import "github.com/kvroute/kvroute/internal/hashtab"

// groupBlocks is how many consecutive blocks of a sequence share one entry
// of the cache's table: 256 tokens with vLLM's 16-token blocks, half a
// Mooncake trace block. A group costs about as much memory as that many
// blocks' entries in a table of blocks, when full.
const groupBlocks = 16

// Where a block is published: a group's slot (group·groupBlocks + slot), or
// one of these.
const (
	unpublished int32 = -1
	spilled     int32 = -2 // in groupTable.spill
)

// groupTable finds published blocks by hash. Blocks groupBlocks·g to
// groupBlocks·(g+1)-1 of a sequence form a group, named by the hash of its
// first block (which, chained, names the whole prefix before it), and
// lookups and insertions of consecutive blocks find their group once. Two
// sequences that share a group's first block but differ later in it want
// the same slot for different blocks: the second goes to spill, a table of
// single blocks. A hash is published at most once, in a group or in spill.
type groupTable struct {
	byKey  hashtab.Table // a group's key → its index in groups
	groups []group
	unused []int32
	spill  hashtab.Table // block hash → block
	// published counts the blocks findable, in groups and in spill.
	published int
}

type group struct {
	key    uint64
	n      int32 // blocks published in it
	hashes [groupBlocks]uint64
	blocks [groupBlocks]int32 // none where empty
}

// cursor remembers the group of the last block a run of lookups or
// insertions went through.
type cursor struct {
	first int   // index in the sequence of the group's first block; -1: none yet
	g     int32 // the group, or none if there is none
}

func newCursor() cursor { return cursor{first: -1, g: none} }

func newGroupTable(blocks int) groupTable {
	// Most groups are full, and the table grows if not.
	return groupTable{byKey: hashtab.New(max(blocks/groupBlocks, 8))}
}

// at moves c to the group of block i of the sequence hashes.
func (t *groupTable) at(c *cursor, hashes []uint64, i int) {
	if first := i - i%groupBlocks; c.first != first {
		c.first = first
		g, ok := t.byKey.Get(hashes[first])
		c.g = none
		if ok {
			c.g = g
		}
	}
}

// find returns the block published as block i of the sequence hashes, or
// none.
func (t *groupTable) find(c *cursor, hashes []uint64, i int) int32 {
	t.at(c, hashes, i)
	h := hashes[i]
	if c.g != none {
		gr := &t.groups[c.g]
		if s := i % groupBlocks; gr.blocks[s] != none && gr.hashes[s] == h {
			return gr.blocks[s]
		}
	}
	if b, ok := t.spill.Get(h); ok {
		return b
	}
	return none
}

// insert publishes b as block i of the sequence hashes, unless a block is
// already published under hashes[i], and returns where.
func (t *groupTable) insert(c *cursor, hashes []uint64, i int, b int32) (int32, bool) {
	if t.find(c, hashes, i) != none {
		return unpublished, false
	}
	if c.g == none {
		c.g = t.newGroup(hashes[c.first])
	}
	t.published++
	gr := &t.groups[c.g]
	s := i % groupBlocks
	if gr.blocks[s] != none {
		t.spill.Insert(hashes[i], b)
		return spilled, true
	}
	gr.hashes[s], gr.blocks[s] = hashes[i], b
	gr.n++
	return c.g*groupBlocks + int32(s), true
}

// remove unpublishes the block at at, published under h.
func (t *groupTable) remove(at int32, h uint64) {
	t.published--
	if at == spilled {
		t.spill.Delete(h)
		return
	}
	g := at / groupBlocks
	gr := &t.groups[g]
	gr.blocks[at%groupBlocks] = none
	if gr.n--; gr.n == 0 {
		t.byKey.Delete(gr.key)
		t.unused = append(t.unused, g)
	}
}

func (t *groupTable) newGroup(key uint64) int32 {
	var g int32
	if n := len(t.unused); n > 0 {
		g = t.unused[n-1]
		t.unused = t.unused[:n-1]
	} else {
		g = int32(len(t.groups))
		t.groups = append(t.groups, group{})
	}
	gr := &t.groups[g]
	gr.key, gr.n = key, 0
	for s := range gr.blocks {
		gr.blocks[s] = none
	}
	t.byKey.Insert(key, g)
	return g
}
