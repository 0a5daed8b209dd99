package engine

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

// replayDigest plays a fixed random workload through an engine with a small
// cache (so that blocks are shared, evicted and preempted all the time) and
// returns a digest of everything observable: every step's times and tokens,
// every request's timings, cached tokens and preemptions, and the final
// counters.
func replayDigest(t testing.TB) uint64 {
	p := testProfile(t, 3000, 2048, 64)
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(11, 12))
	var d xxhash.Digest
	put := func(vs ...int64) {
		var buf [8]byte
		for _, v := range vs {
			binary.LittleEndian.PutUint64(buf[:], uint64(v))
			d.Write(buf[:])
		}
	}
	var reqs []*Request
	now := time.Duration(0)
	for i := range 3000 {
		// Prompts under 20 shared prefixes of 0-40 blocks, then a tail of
		// their own; ids count from the trace's block ids.
		group := uint64(rng.IntN(20))
		ids := make([]uint64, 0, 40)
		for k := range rng.IntN(40) {
			ids = append(ids, group<<20|uint64(k))
		}
		for range 1 + rng.IntN(20) {
			ids = append(ids, rng.Uint64())
		}
		tokens := len(ids)*64 - rng.IntN(64)
		out := 1 + rng.IntN(300)
		r := &Request{ID: uint64(i), PromptLen: tokens, MaxTokens: out, BlockHashes: HashBlockIDs(nil, ids, 64, tokens, p.BlockSize)}
		if err := e.Add(now, r); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
		// Step until the next arrival, about 60 ms later.
		next := now + time.Duration(rng.ExpFloat64()*float64(60*time.Millisecond))
		for e.HasWork() && now < next {
			res := e.Step(now)
			put(int64(res.Start), int64(res.End), int64(res.PrefillTokens), int64(res.DecodeTokens), int64(res.Preempted))
			for _, r := range res.Tokens {
				put(int64(r.ID), int64(r.Output))
			}
			if res.End == res.Start {
				break
			}
			now = res.End
		}
		now = max(now, next)
	}
	now = drain(t, e, now)
	for _, r := range reqs {
		put(int64(r.FirstToken), int64(r.Finish), int64(r.CachedTokens), int64(r.Preemptions), int64(r.Output))
	}
	st := e.Stats()
	if testing.Verbose() {
		t.Logf("hits %d of %d tokens, %d preemptions, %d blocks evicted, %d steps", st.PrefixHits, st.PrefixQueries, st.Preemptions, st.EvictedBlocks, st.Steps)
	}
	put(int64(now), st.PrefixHits, st.PrefixQueries, st.Preemptions, st.EvictedBlocks, st.Steps, int64(st.BusyTime))
	return d.Sum64()
}

// goldenDigest is replayDigest as the engine computed it with a Go map as
// the index of published blocks, before that index became blockTable. An
// optimisation of the engine must leave it unchanged: the simulator's claim
// to run the emulator's model rests on it.
const goldenDigest = 0x83ec8b38d685c9f

func TestReplayIdentical(t *testing.T) {
	got := replayDigest(t)
	if got != goldenDigest {
		t.Errorf("replay digest %#x, want %#x: the engine's behaviour changed", got, uint64(goldenDigest))
	}
}
