package engine

import (
	"encoding/binary"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// rootHash is the parent of a sequence's first block.
const rootHash uint64 = 0x6b76726f75746521 // "kvroute!"

// HashTokens appends to dst the chained hashes of the full blocks of tokens:
// block i's hash covers block i-1's hash and block i's token ids, so equal
// hashes mean equal content and an equal prefix before it, as in vLLM's
// prefix caching. A partial last block gets no hash.
func HashTokens(dst []uint64, tokens []int32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	var d xxhash.Digest
	var buf [8]byte
	parent := rootHash
	for start := 0; start+blockSize <= len(tokens); start += blockSize {
		d.Reset()
		binary.LittleEndian.PutUint64(buf[:], parent)
		d.Write(buf[:])
		for _, t := range tokens[start : start+blockSize] {
			binary.LittleEndian.PutUint32(buf[:4], uint32(t))
			d.Write(buf[:4])
		}
		parent = d.Sum64()
		dst = append(dst, parent)
	}
	return dst
}

// ChainHash is the hash of a block whose content is identified by content
// (for example a trace's block id) following a block with hash parent; pass
// 0 as the parent of a first block. It lets a simulation describe prompts by
// block without materialising their tokens.
func ChainHash(parent, content uint64) uint64 {
	if parent == 0 {
		parent = rootHash
	}
	return sum16(parent, content)
}

// sum16 is xxhash.Sum64 of a and b in little-endian order: XXH64 of 16
// bytes, with the library's generic path (a call, a slice, a length
// switch) folded away. A simulation with 16-token blocks chains a hash for
// every block of every prompt; TestSum16 checks it against the library.
func sum16(a, b uint64) uint64 {
	const (
		prime1 uint64 = 11400714785074694791
		prime2 uint64 = 14029467366897019727
		prime3 uint64 = 1609587929392839161
		prime4 uint64 = 9650029242287828579
		prime5 uint64 = 2870177450012600261
	)
	h := prime5 + 16
	for _, k := range [2]uint64{a, b} {
		h ^= bits.RotateLeft64(k*prime2, 31) * prime1
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
	}
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

// HashBlockIDs appends the chained hashes of the full blocks of a prompt of
// tokens tokens that a trace describes only by block ids, each id standing
// for idTokens tokens (512 in Mooncake traces). Engine block j lies in trace
// block j·blockSize/idTokens; prompts that share leading ids share the hashes
// of those blocks, as prompts sharing those tokens would.
func HashBlockIDs(dst []uint64, ids []uint64, idTokens, tokens, blockSize int) []uint64 {
	if blockSize <= 0 || idTokens <= 0 {
		return dst
	}
	var parent uint64
	for j := 0; (j+1)*blockSize <= tokens; j++ {
		k := j * blockSize / idTokens
		if k >= len(ids) {
			break
		}
		// The content of engine block j: which trace block and where in it.
		parent = ChainHash(parent, ids[k]*uint64(idTokens)+uint64(j*blockSize%idTokens))
		dst = append(dst, parent)
	}
	return dst
}
