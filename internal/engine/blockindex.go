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
type blockIndex struct {
	grouped bool
	chains  hashtab.Chains
	table   hashtab.Table
}

func newBlockIndex(blocks, blockSize int) blockIndex {
	if blockSize*hashtab.GroupBlocks <= groupTokens {
		return blockIndex{grouped: true, chains: hashtab.NewChains(blocks)}
	}
	return blockIndex{table: hashtab.New(blocks)}
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
		return x.chains.Insert(cur, hashes, i, b)
	}
	if x.table.Insert(hashes[i], b) {
		return 0
	}
	return hashtab.Absent
}

// remove unpublishes the block published under h at at.
func (x *blockIndex) remove(at int32, h uint64) {
	if x.grouped {
		x.chains.Remove(at, h)
	} else {
		x.table.Delete(h)
	}
}

func (x *blockIndex) len() int {
	if x.grouped {
		return x.chains.Len()
	}
	return x.table.Len()
}
