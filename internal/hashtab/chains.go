package hashtab

// GroupBlocks is how many consecutive blocks of a sequence share one entry
// of a Chains' table: 512 tokens with vLLM's 16-token blocks, a Mooncake
// trace block, where prompts part ways. A full group costs about as much
// memory as that many entries of a Table. (Groups of 16 cost a simulation
// with 16-token blocks 5 to 8 % more time: twice the table's operations.)
const GroupBlocks = 32

// Where a value is in a Chains: a group's slot (group·GroupBlocks + slot),
// or one of these.
const (
	// Absent is where a value that is not in the Chains is; callers may
	// use it as their own "not inserted".
	Absent  int32 = -1
	spilled int32 = -2 // in Chains.spill
)

// Chains maps the chained block hashes of sequences (block i's hash covers
// every block before it, as vLLM's prefix caching and the router's prefix
// index name blocks) to int32 values in [0, MaxInt32): what a Table does,
// with a fraction of the cache misses when blocks are looked up, inserted
// and removed in runs, as a prompt's are.
//
// Blocks GroupBlocks·g to GroupBlocks·(g+1)-1 of a sequence form a group,
// named by the hash of its first block (which names the whole prefix before
// it), and a run of lookups or insertions finds each group once. Two
// sequences that share a group's first block but differ later in it want
// the same slot for different hashes: the second goes to spill, a Table of
// single blocks. A hash is in the Chains at most once, in a group or in
// spill. Every sequence given must start at its first block, and a hash
// must name its whole prefix (as chained hashes do): the group a block is
// looked for in is named by an earlier block. Not safe for concurrent use.
type Chains struct {
	byKey Table // a group's key → its index: group g is chunks[g/chunkGroups][g%chunkGroups]
	// The groups in chunks of chunkGroups, which stay where they are: one
	// slice of groups, grown by doubling, had a fleet of engines copy
	// gigabytes of them.
	chunks [][]group
	count  int32 // groups made
	unused []int32
	spill  Table // block hash → value
	n      int
}

// chunkGroups is how many groups a Chains allocates at once (25 KiB).
const chunkGroups = 64

func (t *Chains) group(g int32) *group {
	return &t.chunks[uint32(g)/chunkGroups][uint32(g)%chunkGroups]
}

type group struct {
	key    uint64
	n      int32 // values in it
	hashes [GroupBlocks]uint64
	vals   [GroupBlocks]int32 // Absent where empty
}

// A Cursor remembers the group of the last block a run of calls went
// through. Start every run with NewCursor; a cursor is valid until the next
// Remove.
type Cursor struct {
	first int   // index in the sequence of the group's first block; -1: none yet
	g     int32 // the group, or Absent if there is none
}

// NewCursor returns a cursor at no group.
func NewCursor() Cursor { return Cursor{first: -1, g: Absent} }

// NewChains returns a Chains that holds about blocks values before its
// tables first grow, if most groups are full.
func NewChains(blocks int) Chains {
	return Chains{byKey: New(max(blocks/GroupBlocks, 8))}
}

// Len returns the number of values.
func (t *Chains) Len() int { return t.n }

// seek moves c to the group of block i of the sequence hashes.
func (t *Chains) seek(c *Cursor, hashes []uint64, i int) {
	if first := i - i%GroupBlocks; c.first != first {
		c.first = first
		g, ok := t.byKey.Get(hashes[first])
		c.g = Absent
		if ok {
			c.g = g
		}
	}
}

// Get returns the value of block i of the sequence hashes.
func (t *Chains) Get(c *Cursor, hashes []uint64, i int) (int32, bool) {
	t.seek(c, hashes, i)
	h := hashes[i]
	if c.g != Absent {
		gr := t.group(c.g)
		if s := i % GroupBlocks; gr.vals[s] != Absent && gr.hashes[s] == h {
			return gr.vals[s], true
		}
	}
	return t.spill.Get(h)
}

// Insert sets block i of the sequence hashes to v unless it is present, and
// returns where it put it, for Remove, or Absent if it was present.
func (t *Chains) Insert(c *Cursor, hashes []uint64, i int, v int32) int32 {
	if _, ok := t.Get(c, hashes, i); ok {
		return Absent
	}
	if c.g == Absent {
		c.g = t.newGroup(hashes[c.first])
	}
	t.n++
	gr := t.group(c.g)
	s := i % GroupBlocks
	if gr.vals[s] != Absent {
		t.spill.Insert(hashes[i], v)
		return spilled
	}
	gr.hashes[s], gr.vals[s] = hashes[i], v
	gr.n++
	return c.g*GroupBlocks + int32(s)
}

// Remove deletes the block hash h, which Insert put at at.
func (t *Chains) Remove(at int32, h uint64) {
	t.n--
	if at == spilled {
		t.spill.Delete(h)
		return
	}
	g := at / GroupBlocks
	gr := t.group(g)
	gr.vals[at%GroupBlocks] = Absent
	if gr.n--; gr.n == 0 {
		t.byKey.Delete(gr.key)
		t.unused = append(t.unused, g)
	}
}

func (t *Chains) newGroup(key uint64) int32 {
	var g int32
	if n := len(t.unused); n > 0 {
		g = t.unused[n-1]
		t.unused = t.unused[:n-1]
	} else {
		if t.count%chunkGroups == 0 {
			t.chunks = append(t.chunks, make([]group, chunkGroups))
		}
		g = t.count
		t.count++
	}
	gr := t.group(g)
	gr.key, gr.n = key, 0
	for s := range gr.vals {
		gr.vals[s] = Absent
	}
	t.byKey.Insert(key, g)
	return g
}
