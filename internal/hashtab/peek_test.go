package hashtab

import "testing"

// Peek reads grouped and spilled values alike and changes nothing: every
// value is found as before, and each can still be removed where it is.
func TestPeekChangesNothing(t *testing.T) {
	ch := NewChains(64)
	var a, b []uint64
	for i := range 40 {
		a = append(a, chain(a, uint64(i)))
		// b shares a's first 20 blocks and parts ways inside a group: its
		// next blocks want slots a's hold and spill.
		if i < 20 {
			b = append(b, a[i])
		} else {
			b = append(b, chain(b, uint64(1000+i)))
		}
	}
	where := map[uint64]int32{}
	for _, s := range [][]uint64{a, b} {
		cur := NewCursor()
		for i, h := range s {
			if at := ch.Insert(&cur, s, i, int32(i)); at != Absent {
				where[h] = at
			}
		}
	}
	if ch.spill.Len() == 0 {
		t.Fatal("nothing spilled: the test does not reach that path")
	}
	for h, at := range where {
		ch.Peek(at, h)
	}
	if ch.Len() != len(where) {
		t.Fatalf("Len %d after Peek, want %d", ch.Len(), len(where))
	}
	for _, s := range [][]uint64{a, b} {
		cur := NewCursor()
		for i := range s {
			if v, ok := ch.Get(&cur, s, i); !ok || v != int32(i) {
				t.Fatalf("block %d after Peek: %d, %v", i, v, ok)
			}
		}
	}
	for h, at := range where {
		ch.Remove(at, h)
	}
	if ch.Len() != 0 || ch.spill.Len() != 0 || ch.byKey.Len() != 0 {
		t.Errorf("after removing everything: %d values, %d spilled, %d groups", ch.Len(), ch.spill.Len(), ch.byKey.Len())
	}
}
