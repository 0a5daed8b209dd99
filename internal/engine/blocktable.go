package engine

import "math/bits"

// blockTable maps the hashes of published blocks to the blocks: what a Go
// map[uint64]int32 would do, as an open-addressing table with linear
// probing, sized once for the cache (it never holds more entries than the
// cache has blocks) and never more than half full. A fleet simulation does a
// lookup, insertion or deletion for every 16-token block of every prompt,
// mostly cache misses; this table costs one probe where the map costs two
// or three, and publish and evict take one operation each instead of two.
// Not safe for concurrent use.
type blockTable struct {
	keys  []uint64
	vals  []int32 // block + 1; 0 marks an empty slot
	shift uint
	mask  uint64
}

func newBlockTable(blocks int) blockTable {
	n := 1 << bits.Len(uint(max(2*blocks, 8)-1)) // a power of two ≥ 2 × blocks
	return blockTable{
		keys:  make([]uint64, n),
		vals:  make([]int32, n),
		shift: uint(64 - bits.TrailingZeros(uint(n))),
		mask:  uint64(n - 1),
	}
}

// home is h's first slot. Fibonacci hashing spreads keys that are not
// uniform themselves (tests use small numbers).
func (t *blockTable) home(h uint64) uint64 { return (h * 0x9e3779b97f4a7c15) >> t.shift }

// get returns the block published under h.
func (t *blockTable) get(h uint64) (int32, bool) {
	for i := t.home(h); ; i = (i + 1) & t.mask {
		switch v := t.vals[i]; {
		case v == 0:
			return 0, false
		case t.keys[i] == h:
			return v - 1, true
		}
	}
}

// insert publishes b under h unless h is present, and reports whether it
// did.
func (t *blockTable) insert(h uint64, b int32) bool {
	for i := t.home(h); ; i = (i + 1) & t.mask {
		switch v := t.vals[i]; {
		case v == 0:
			t.keys[i], t.vals[i] = h, b+1
			return true
		case t.keys[i] == h:
			return false
		}
	}
}

// deleteIf removes h if it names block b.
func (t *blockTable) deleteIf(h uint64, b int32) {
	i := t.home(h)
	for ; ; i = (i + 1) & t.mask {
		switch v := t.vals[i]; {
		case v == 0:
			return
		case t.keys[i] == h:
			if v != b+1 {
				return
			}
			t.removeAt(i)
			return
		}
	}
}

// removeAt empties slot i, shifting back later entries of its probe run
// whose home does not lie after the hole, so that no lookup ever stops
// early and no tombstones accumulate.
func (t *blockTable) removeAt(i uint64) {
	for {
		t.vals[i] = 0
		j := i
		for {
			j = (j + 1) & t.mask
			if t.vals[j] == 0 {
				return
			}
			// The entry at j may fill the hole at i unless its home lies
			// cyclically in (i, j].
			k := t.home(t.keys[j])
			if (j-k)&t.mask >= (j-i)&t.mask {
				t.keys[i], t.vals[i] = t.keys[j], t.vals[j]
				i = j
				break
			}
		}
	}
}
