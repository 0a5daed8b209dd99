package kvevents

import (
	"encoding/binary"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// Match returns backend's state and block size, and how many leading
// blocks of keys (a prompt's chain, as TokenChain or the engine makes it
// for that block size) it holds on the GPU, and on the GPU or the CPU.
func (s *Store) Match(backend int, keys func(blockSize int) []uint64) (st State, blockSize, gpu, any int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	h := s.backends[backend]
	if h == nil || h.state == Unknown || h.blockSize <= 0 {
		if h != nil {
			return h.state, h.blockSize, 0, 0
		}
		return Unknown, 0, 0, 0
	}
	ks := keys(h.blockSize)
	g, c := h.media[MediumGPU], h.media[MediumCPU]
	for _, k := range ks {
		inGPU := g.holds(k)
		if !inGPU && !c.holds(k) {
			break
		}
		if inGPU && gpu == any {
			gpu++
		}
		any++
	}
	return h.state, h.blockSize, gpu, any
}

// Matched is what one backend's events say of a prompt.
type Matched struct {
	State     State
	BlockSize int
	// Blocks are the prompt's leading blocks the backend holds on the GPU.
	Blocks int
}

// MatchGPU sets dst[i] to what backends[i] holds of a prompt on the GPU;
// keys returns the prompt's chain for a block size (once per block size
// the backends use). It walks the prompt's keys once for all backends,
// stopping where none holds the next.
func (s *Store) MatchGPU(backends []int, keys func(blockSize int) []uint64, dst []Matched) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var sizes []int
	for i, b := range backends {
		dst[i] = Matched{}
		if b >= 0 && b < len(s.info) {
			in := s.info[b]
			dst[i] = Matched{State: in.state, BlockSize: int(in.blockSize)}
			if in.state != Unknown && in.blockSize > 0 && !slices.Contains(sizes, int(in.blockSize)) {
				sizes = append(sizes, int(in.blockSize))
			}
		}
	}
	var held []int32
	for _, bs := range sizes {
		if held == nil {
			held = make([]int32, len(s.info))
		} else {
			clear(held)
		}
		if !s.walk(keys(bs), held) {
			continue
		}
		for i, b := range backends {
			if dst[i].BlockSize == bs && dst[i].State != Unknown && b >= 0 && b < len(held) {
				dst[i].Blocks = int(held[b])
			}
		}
	}
}

// walk sets held[b], for every backend b holding at least the first of
// keys on the GPU, to how many leading keys it holds, and reports whether
// any does. Call with mu held.
func (s *Store) walk(keys []uint64, held []int32) bool {
	for i, k := range keys {
		alive := false
		for _, b := range s.holders[k] {
			if int(b) < len(held) && held[b] == int32(i) {
				held[b], alive = int32(i+1), true
			}
		}
		if !alive {
			return i > 0
		}
	}
	return len(keys) > 0
}

// rootKey is the parent key of a base-model prompt's first block.
const rootKey uint64 = 0x6b762d6576656e74 // "kv-event"

// loraRoot is the parent key of a prompt's first block under a LoRA
// adapter: blocks computed with an adapter are not the base model's.
func loraRoot(id int, name string) uint64 {
	if id == 0 && name == "" {
		return rootKey
	}
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], uint64(id))
	return xxhash.Sum64String(string(buf[:])+name) ^ rootKey
}

// TokenIDs converts token ids read as JSON numbers to the store's int32s
// as the events' decoder does: a vocabulary's ids fit in 31 bits, but ids
// up to 2^32 (llm-d's simulator hashes words into them) keep their 32 bits,
// which is all TokenChain hashes.
func TokenIDs(ids []int64) []int32 {
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

// TokenChain appends to dst the keys of the full blockSize blocks of
// tokens, a base-model prompt: key i covers key i-1 and block i's token
// ids, as the engines' own chains do.
func TokenChain(dst []uint64, tokens []int32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	parent := rootKey
	for start := 0; start+blockSize <= len(tokens); start += blockSize {
		parent = chainStep(parent, tokens[start:start+blockSize])
		dst = append(dst, parent)
	}
	return dst
}

// chainStep returns the key of block after parent. It runs once per block
// of every prompt routed, and SGLang's pages are one token by default (a
// 100k-token prompt, 100k steps), so it mixes the token ids in registers
// rather than through a streaming hash: each token is xored in and the
// state multiplied by an odd constant and xor-shifted, both bijections, so
// one-token blocks of one parent never collide; murmur3's finalizer then
// spreads the bits.
func chainStep(parent uint64, block []int32) uint64 {
	h := parent ^ uint64(len(block))*0xc2b2ae3d27d4eb4f
	for _, t := range block {
		h ^= uint64(uint32(t))
		h *= 0x9e3779b97f4a7c15
		h ^= h >> 29
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	if h == 0 { // 0 means unmatchable
		h = 1
	}
	return h
}

// Deepest appends to dst, without repeating any already there, up to want
// backends holding the deepest leading blocks of a prompt on the GPU,
// deepest first; keys returns the prompt's chain for a block size (once per
// block size the backends use). It is what a router that scores only the
// candidates that can win needs from the events: its work grows with the
// prompt's blocks and want, not the fleet, where MatchGPU's grows with the
// backends it is asked about. A chain's key names its whole prefix, so the
// holders of the deepest key held anywhere are the deepest holders; their
// exact depth is MatchGPU's to count.
func (s *Store) Deepest(dst []int32, keys func(blockSize int) []uint64, want int) []int32 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	added := 0
	for _, bs := range s.sizes {
		ks := keys(bs)
		depth := 0
		for depth < len(ks) && len(s.holders[ks[depth]]) > 0 {
			depth++
		}
		for i := depth - 1; i >= 0 && added < want; i-- {
			for _, b := range s.holders[ks[i]] {
				if int(b) >= len(s.info) || int(s.info[b].blockSize) != bs || slices.Contains(dst, b) {
					continue
				}
				dst = append(dst, b)
				if added++; added == want {
					break
				}
			}
		}
	}
	return dst
}

// Holding reports whether any backend holds any block on the GPU: if
// none does, a prompt need not be tokenized to ask Deepest.
func (s *Store) Holding() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.holders) > 0
}
