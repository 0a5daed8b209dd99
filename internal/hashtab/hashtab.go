// Package hashtab is a hash table from 64-bit hashes to small non-negative
// integers: what a Go map[uint64]int32 does, as an open-addressing table
// with linear probing that is never more than half full and deletes by
// shifting entries back instead of leaving tombstones.
//
// The engine model indexes every published KV block with one, and the
// router's prefix index every block it remembers. A fleet simulation does
// a lookup, insertion or deletion for every block of every prompt, mostly
// of keys not in cache: here that is one probe of one array whose entries
// keep key and value side by side (one cache miss, not one per array),
// where a Go map after many deletions probes several groups, and the array
// holds no pointer for the garbage collector to scan. Chains does the
// same for the chained block hashes of sequences, with one entry for a run
// of blocks.
package hashtab

import "math/bits"

// Table maps uint64 keys to int32 values in [0, MaxInt32). The zero Table
// is empty and ready to use. Not safe for concurrent use.
type Table struct {
	slots []slot
	n     int
	shift uint
	mask  uint64
}

// slot is one entry: 12 bytes (a uint64 key would pad it to 16 and grow a
// fleet's tables by a third), so that a few straddle two cache lines.
type slot struct {
	lo, hi uint32 // the key's halves
	val    int32  // value + 1; 0 marks an empty slot
}

func (s *slot) key() uint64 { return uint64(s.hi)<<32 | uint64(s.lo) }

func newSlot(key uint64, stored int32) slot {
	return slot{lo: uint32(key), hi: uint32(key >> 32), val: stored}
}

// New returns a table that holds size entries before it first grows.
func New(size int) Table {
	var t Table
	t.resize(2 * size)
	return t
}

// resize rehashes into a power of two of at least slots slots (and 8).
func (t *Table) resize(slots int) {
	n := 1 << bits.Len(uint(max(slots, 8)-1))
	old := t.slots
	t.slots = make([]slot, n)
	t.shift, t.mask = uint(64-bits.TrailingZeros(uint(n))), uint64(n-1)
	t.n = 0
	for _, s := range old {
		if s.val != 0 {
			t.place(s.key(), s.val)
		}
	}
}

// Len returns the number of entries.
func (t *Table) Len() int { return t.n }

// home is h's first slot. Fibonacci hashing spreads keys that are not
// uniform themselves (tests use small numbers).
func (t *Table) home(h uint64) uint64 { return (h * 0x9e3779b97f4a7c15) >> t.shift }

// Get returns the value of h.
func (t *Table) Get(h uint64) (int32, bool) {
	if t.n == 0 {
		return 0, false
	}
	for i := t.home(h); ; i = (i + 1) & t.mask {
		switch s := &t.slots[i]; {
		case s.val == 0:
			return 0, false
		case s.key() == h:
			return s.val - 1, true
		}
	}
}

// Insert sets h to v unless h is present, and reports whether it did.
func (t *Table) Insert(h uint64, v int32) bool {
	if 2*(t.n+1) > len(t.slots) {
		t.resize(2 * len(t.slots))
	}
	for i := t.home(h); ; i = (i + 1) & t.mask {
		switch s := &t.slots[i]; {
		case s.val == 0:
			*s = newSlot(h, v+1)
			t.n++
			return true
		case s.key() == h:
			return false
		}
	}
}

// place puts an entry known to be absent into a table with room.
func (t *Table) place(h uint64, stored int32) {
	i := t.home(h)
	for t.slots[i].val != 0 {
		i = (i + 1) & t.mask
	}
	t.slots[i] = newSlot(h, stored)
	t.n++
}

// Delete removes h.
func (t *Table) Delete(h uint64) { t.DeleteIf(h, -1) }

// DeleteIf removes h if its value is v, or whatever its value if v is -1.
func (t *Table) DeleteIf(h uint64, v int32) {
	if t.n == 0 {
		return
	}
	for i := t.home(h); ; i = (i + 1) & t.mask {
		switch s := &t.slots[i]; {
		case s.val == 0:
			return
		case s.key() == h:
			if v >= 0 && s.val != v+1 {
				return
			}
			t.removeAt(i)
			t.n--
			return
		}
	}
}

// removeAt empties slot i, shifting back later entries of its probe run
// whose home does not lie after the hole, so that no lookup ever stops
// early and no tombstones accumulate.
func (t *Table) removeAt(i uint64) {
	for {
		t.slots[i].val = 0
		j := i
		for {
			j = (j + 1) & t.mask
			if t.slots[j].val == 0 {
				return
			}
			// The entry at j may fill the hole at i unless its home lies
			// cyclically in (i, j].
			k := t.home(t.slots[j].key())
			if (j-k)&t.mask >= (j-i)&t.mask {
				t.slots[i] = t.slots[j]
				i = j
				break
			}
		}
	}
}
