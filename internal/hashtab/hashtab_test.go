package hashtab

import (
	"math/rand/v2"
	"testing"
)

// A Table behaves as a Go map under random insertions, lookups and
// deletions: sized for its entries, grown from empty, and with keys
// crowding a few slots.
func TestTableIsAMap(t *testing.T) {
	for _, tc := range []struct {
		keys, size int
	}{{40, 500}, {1000, 500}, {100_000, 500}, {1000, 0}, {100_000, 0}} {
		const most = 500
		tbl := New(tc.size)
		if tc.size == 0 {
			tbl = Table{}
		}
		ref := map[uint64]int32{}
		rng := rand.New(rand.NewPCG(uint64(tc.keys), uint64(tc.size)))
		for op := range 200_000 {
			h := uint64(rng.IntN(tc.keys))
			if tc.keys == 100_000 {
				h *= 0x100000 // many keys with equal low bits
			}
			switch rng.IntN(3) {
			case 0:
				if len(ref) >= most {
					continue
				}
				v := int32(rng.IntN(most))
				_, had := ref[h]
				if got := tbl.Insert(h, v); got == had {
					t.Fatalf("op %d: Insert(%d) = %v with the key present: %v", op, h, got, had)
				}
				if !had {
					ref[h] = v
				}
			case 1:
				v := int32(rng.IntN(most))
				if w, ok := ref[h]; ok && (w == v || rng.IntN(2) == 0) {
					v = w
				}
				if rng.IntN(8) == 0 {
					tbl.Delete(h)
					delete(ref, h)
					break
				}
				tbl.DeleteIf(h, v)
				if w, ok := ref[h]; ok && w == v {
					delete(ref, h)
				}
			default:
				v, ok := tbl.Get(h)
				w, wok := ref[h]
				if ok != wok || v != w {
					t.Fatalf("op %d: Get(%d) = %d, %v; want %d, %v", op, h, v, ok, w, wok)
				}
			}
			if tbl.Len() != len(ref) {
				t.Fatalf("op %d: Len() = %d, want %d", op, tbl.Len(), len(ref))
			}
		}
		for h, w := range ref {
			if v, ok := tbl.Get(h); !ok || v != w {
				t.Fatalf("Get(%d) = %d, %v; want %d", h, v, ok, w)
			}
		}
	}
}
