package engine

import "github.com/kvroute/kvroute/internal/hashtab"

// groupTokens bounds the tokens of a group of blocks found through one
// table entry (hashtab.Chains): a trace's block (512 tokens in Mooncake's),
// where its prompts part ways. Blocks larger than a group's share are each
// their own entry, in a hashtab.Table: with 512-token blocks, a group of
// 32 would span whole prompts, and prompts that share only a first block
// (a system prompt) would crowd into its group's spill.
const groupTokens = 512

// blockIndex finds the cache's published blocks by hash, in groups of
// consecutive blocks when blocks are small (a fleet with vLLM's 16-token
// blocks does a 32nd of the table operations, each a cache miss),
// one entry per block otherwise.
//
// It keeps the hash each block is published under, so that the cache's
// block records need not: grouped, in the group (or, for the few blocks
// in the spill, in spilled); otherwise in hashes.
type blockIndex struct {
	grouped bool
	chains  hashtab.Chains
	spilled map[int32]uint64 // block → hash, of the blocks in the chains' spill
	table   hashtab.Table
	hashes  []uint64 // block → hash, one entry per block
}

func newBlockIndex(blocks, blockSize int) blockIndex {
	if blockSize*hashtab.GroupBlocks <= groupTokens {
		return blockIndex{grouped: true, chains: hashtab.NewChains(blocks), spilled: map[int32]uint64{}}
	}
	return blockIndex{table: hashtab.New(blocks), hashes: make([]uint64, blocks)}
}

// get returns the block published as block i of the sequence hashes; cur is
// the run's (hashtab.NewCursor at its start).
func (x *blockIndex) get(cur *hashtab.Cursor, hashes []uint64, i int) (int32, bool) {
	if x.grouped {
		return x.chains.Get(cur, hashes, i)
	}
	return x.table.Get(hashes[i])
}

// insert publishes b as block i of hashes, unless a block is published
// under hashes[i], and returns where, for remove (any value but
// hashtab.Absent when there is one entry per block), or hashtab.Absent.
func (x *blockIndex) insert(cur *hashtab.Cursor, hashes []uint64, i int, b int32) int32 {
	if x.grouped {
		at := x.chains.Insert(cur, hashes, i, b)
		if hashtab.Spilled(at) {
			x.spilled[b] = hashes[i]
		}
		return at
	}
	if x.table.Insert(hashes[i], b) {
		x.hashes[b] = hashes[i]
		return 0
	}
	return hashtab.Absent
}

// remove unpublishes block b, published at at, and returns its hash.
func (x *blockIndex) remove(at, b int32) uint64 {
	if !x.grouped {
		h := x.hashes[b]
		x.table.Delete(h)
		return h
	}
	var h uint64
	if hashtab.Spilled(at) {
		h = x.spilled[b]
		delete(x.spilled, b)
	} else {
		h = x.chains.HashAt(at)
	}
	x.chains.Remove(at, h)
	return h
}

func (x *blockIndex) len() int {
	if x.grouped {
		return x.chains.Len()
	}
	return x.table.Len()
}
