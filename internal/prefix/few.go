package prefix

import "slices"

// MatchFew is Match for a few backends instead of all: a router that
// scores only the candidates that can win needs the matches of the
// backends holding the most of the prompt and of a few others (the least
// loaded), and Match's per-backend slices cost as much to clear as the
// fleet is large.
//
// It appends to backends, without repeating any already there, up to
// deepest backends holding the deepest blocks of hashes (in any of the
// first len(matched) tiers), deepest first; then sets matched[t][b], for
// every b in backends, to the number of leading blocks of hashes b holds in
// tier t, as Match would, leaving the other entries of matched alone. It
// returns backends and the longest tier-0 match among them. Its work grows
// with the prompt's blocks and the backends asked about, not the fleet.
func (ix *Index) MatchFew(hashes []uint64, backends []int32, deepest int, matched ...[]int) ([]int32, int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	bis := ix.known(hashes)
	backends = ix.deepest(bis, backends, deepest, len(matched))
	longest := 0
	for _, b := range backends {
		for t, m := range matched {
			if int(b) >= len(m) {
				continue
			}
			n := 0
			for n < len(bis) {
				if _, ok := ix.holds(bis[n], int(b), t); !ok {
					break
				}
				n++
			}
			m[b] = n
			if t == 0 {
				longest = max(longest, n)
			}
		}
	}
	return backends, longest
}

// known returns the slab indexes of the leading blocks of hashes the index
// has, in a buffer reused by the next call. Call with mu held.
func (ix *Index) known(hashes []uint64) []int32 {
	ix.bis = ix.bis[:0]
	for _, h := range hashes {
		bi, ok := ix.byHash.Get(h)
		if !ok {
			break
		}
		ix.bis = append(ix.bis, bi)
	}
	return ix.bis
}

// deepest appends to backends up to want others holding blocks of bis in
// the first tiers tiers, from the deepest block up. Call with mu held.
func (ix *Index) deepest(bis []int32, backends []int32, want, tiers int) []int32 {
	added := 0
	for i := len(bis) - 1; i >= 0 && added < want; i-- {
		for _, hd := range ix.holders(bis[i]) {
			if int(hd.tier) >= tiers || slices.Contains(backends, hd.backend) {
				continue
			}
			backends = append(backends, hd.backend)
			if added++; added == want {
				break
			}
		}
	}
	return backends
}
