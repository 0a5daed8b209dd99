package engine

import (
	"math/rand/v2"
	"testing"
)

// blockTable behaves as a Go map under random insertions, lookups and
// deletions, at its fullest and with keys crowding a few slots.
func TestBlockTableIsAMap(t *testing.T) {
	for _, keys := range []int{40, 1000, 100_000} {
		const blocks = 500
		tbl := newBlockTable(blocks)
		ref := map[uint64]int32{}
		rng := rand.New(rand.NewPCG(uint64(keys), 3))
		for op := range 200_000 {
			h := uint64(rng.IntN(keys))
			if keys == 100_000 {
				h *= 0x100000 // many keys with equal low bits
			}
			switch rng.IntN(3) {
			case 0:
				if len(ref) >= blocks {
					continue
				}
				b := int32(rng.IntN(blocks))
				_, had := ref[h]
				if got := tbl.insert(h, b); got == had {
					t.Fatalf("op %d: insert(%d) = %v with the key present: %v", op, h, got, had)
				}
				if !had {
					ref[h] = b
				}
			case 1:
				b := int32(rng.IntN(blocks))
				if v, ok := ref[h]; ok && (v == b || rng.IntN(2) == 0) {
					b = v
				}
				tbl.deleteIf(h, b)
				if ref[h] == b {
					delete(ref, h)
				}
			default:
				v, ok := tbl.get(h)
				w, wok := ref[h]
				if ok != wok || v != w {
					t.Fatalf("op %d: get(%d) = %d, %v; want %d, %v", op, h, v, ok, w, wok)
				}
			}
		}
		for h, w := range ref {
			if v, ok := tbl.get(h); !ok || v != w {
				t.Fatalf("get(%d) = %d, %v; want %d", h, v, ok, w)
			}
		}
	}
}
