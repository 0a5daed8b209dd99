package engine

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

// testProfile is the default profile with a small cache and budget so that
// tests reach eviction, preemption and chunking with few tokens.
func testProfile(t testing.TB, blocks, budget, maxSeqs int) Profile {
	t.Helper()
	p, err := LookupProfile(DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	p.NumGPUBlocks, p.MaxNumBatchedTokens, p.MaxNumSeqs = blocks, budget, maxSeqs
	return p
}

// seq returns n distinct token ids starting at base: sequences from
// different bases share no block.
func seq(base, n int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(base + i)
	}
	return ids
}

func newReq(id uint64, bs int, prompt []int32, out int) *Request {
	// Output tokens are part of the hashed sequence, as in the emulator.
	all := append(append([]int32(nil), prompt...), seq(1_000_000+int(id)*10_000, out)...)
	return &Request{ID: id, PromptLen: len(prompt), MaxTokens: out, BlockHashes: HashTokens(nil, all, bs)}
}

// drain steps e from now until it is idle and returns the time it ends.
func drain(t testing.TB, e *Engine, now time.Duration) time.Duration {
	t.Helper()
	for i := 0; e.HasWork(); i++ {
		if i > 1_000_000 {
			t.Fatal("engine did not drain")
		}
		now = e.Step(now).End
	}
	return now
}

func mustAdd(t testing.TB, e *Engine, now time.Duration, r *Request) {
	t.Helper()
	if err := e.Add(now, r); err != nil {
		t.Fatal(err)
	}
}

func TestRepeatedPrefixLowersTTFTAsPredicted(t *testing.T) {
	p := testProfile(t, 0, 8192, 256)
	p.NumGPUBlocks = 0 // the derived H100 capacity
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	prompt := seq(0, 4096)
	a := newReq(1, p.BlockSize, prompt, 4)
	mustAdd(t, e, 0, a)
	now := drain(t, e, 0)
	b := newReq(2, p.BlockSize, prompt, 4)
	mustAdd(t, e, now, b)
	drain(t, e, now)

	// The whole prompt is cached but its last block is recomputed, so that
	// there is a token to sample from.
	if want := 4096 - p.BlockSize; b.CachedTokens != want {
		t.Fatalf("cached tokens = %d, want %d", b.CachedTokens, want)
	}
	var cold, warm Work
	cold.AddChunk(0, 4096)
	warm.AddChunk(4096-p.BlockSize, 4096)
	if got, want := a.FirstToken-a.Arrival, p.StepTime(cold); got != want {
		t.Errorf("cold TTFT = %v, want %v", got, want)
	}
	if got, want := b.FirstToken-b.Arrival, p.StepTime(warm); got != want {
		t.Errorf("warm TTFT = %v, want %v", got, want)
	}
	if a.FirstToken-a.Arrival < 10*(b.FirstToken-b.Arrival) {
		t.Errorf("cache hit saved too little: cold %v, warm %v", a.FirstToken-a.Arrival, b.FirstToken-b.Arrival)
	}
	s := e.Stats()
	if s.PrefixQueries != 8192 || s.PrefixHits != int64(b.CachedTokens) {
		t.Errorf("prefix queries/hits = %d/%d, want 8192/%d", s.PrefixQueries, s.PrefixHits, b.CachedTokens)
	}
}

func TestLRUEvictsLeastRecentlyUsedPrefix(t *testing.T) {
	// 9 blocks of 16 tokens; each prompt is 4 blocks (64 tokens).
	p := testProfile(t, 9, 8192, 256)
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	prompts := map[string][]int32{"A": seq(0, 64), "B": seq(10_000, 64), "C": seq(20_000, 64)}
	now := time.Duration(0)
	id := uint64(0)
	run := func(name string) *Request {
		id++
		r := newReq(id, p.BlockSize, prompts[name], 1)
		mustAdd(t, e, now, r)
		now = drain(t, e, now)
		return r
	}
	cached := func(name string) int {
		hits, _ := e.kv.lookup(HashTokens(nil, prompts[name], p.BlockSize))
		return hits
	}
	run("A")
	run("B")
	// A again: its first 3 blocks hit (the last is recomputed into a new
	// block), and A is now more recently used than B.
	if r := run("A"); r.CachedTokens != 48 {
		t.Fatalf("A again: cached %d tokens, want 48", r.CachedTokens)
	}
	if a, b := cached("A"), cached("B"); a != 4 || b != 4 {
		t.Fatalf("before C: A has %d blocks cached, B %d; want 4 and 4", a, b)
	}
	// C needs 4 blocks and the cache has no free ones left: it evicts the
	// least recently used, each sequence's tail first. Order of the free
	// queue: A's 4th block, then B's blocks 4, 3, 2, 1, then the rest of A.
	run("C")
	if a, b := cached("A"), cached("B"); a != 3 || b != 1 {
		t.Errorf("after C: A has %d blocks cached, B %d; want 3 and 1", a, b)
	}
	if s := e.Stats(); s.EvictedBlocks != 4 || s.UsedBlocks != 0 {
		t.Errorf("evicted %d, used %d: want 4 and 0", s.EvictedBlocks, s.UsedBlocks)
	}
}

func TestPreemptsNewestWhenCacheIsFull(t *testing.T) {
	// 20 blocks; four requests of 2 prompt blocks each grow by 4 blocks of
	// output: 24 blocks needed at once, so someone must yield.
	p := testProfile(t, 20, 8192, 256)
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	var reqs []*Request
	for i := range 4 {
		r := newReq(uint64(i+1), p.BlockSize, seq(i*10_000, 32), 64)
		reqs = append(reqs, r)
		mustAdd(t, e, 0, r)
	}
	sawPreemption := false
	now := time.Duration(0)
	for e.HasWork() {
		res := e.Step(now)
		now = res.End
		if res.Preempted > 0 {
			sawPreemption = true
			// The newest running request is the one that yields.
			if reqs[3].Preemptions == 0 {
				t.Fatalf("preempted someone other than the newest: %v", preemptions(reqs))
			}
		}
		if s := e.Stats(); s.UsedBlocks > s.TotalBlocks {
			t.Fatalf("used %d of %d blocks", s.UsedBlocks, s.TotalBlocks)
		}
	}
	if !sawPreemption {
		t.Fatal("no preemption although the cache could not hold every request")
	}
	for _, r := range reqs {
		if r.State != StateFinished || r.Output != 64 {
			t.Errorf("request %d: state %v, output %d; want finished with 64", r.ID, r.State, r.Output)
		}
	}
	if s := e.Stats(); s.Preemptions == 0 || s.UsedBlocks != 0 || s.GenerationTokens != 4*64 {
		t.Errorf("stats %+v: want preemptions, no blocks held, 256 tokens generated", s)
	}
}

func preemptions(rs []*Request) []int {
	var n []int
	for _, r := range rs {
		n = append(n, r.Preemptions)
	}
	return n
}

func TestChunkedPrefillInterleavesWithDecodes(t *testing.T) {
	const budget = 512
	p := testProfile(t, 1000, budget, 256)
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	decoder := newReq(1, p.BlockSize, seq(0, 100), 100)
	mustAdd(t, e, 0, decoder)
	now := e.Step(0).End // decoder's prefill and first token
	long := newReq(2, p.BlockSize, seq(50_000, 2000), 1)
	mustAdd(t, e, now, long)

	steps := 0
	for long.Output == 0 {
		before := decoder.Output
		res := e.Step(now)
		now = res.End
		steps++
		if decoder.Output != before+1 {
			t.Fatalf("step %d: decoder made %d tokens while the long prompt was prefilled, want 1", steps, decoder.Output-before)
		}
		if res.DecodeTokens != 1 || res.PrefillTokens > budget-1 {
			t.Fatalf("step %d: %d decode + %d prefill tokens, budget %d", steps, res.DecodeTokens, res.PrefillTokens, budget)
		}
	}
	// 2000 prompt tokens in chunks of budget-1 = 511.
	if want := int(math.Ceil(2000.0 / (budget - 1))); steps != want {
		t.Errorf("prefill took %d steps, want %d", steps, want)
	}
}

func TestAbortReleasesBlocks(t *testing.T) {
	p := testProfile(t, 100, 8192, 256)
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	running := newReq(1, p.BlockSize, seq(0, 320), 500)
	waiting := newReq(2, p.BlockSize, seq(10_000, 320), 500)
	mustAdd(t, e, 0, running)
	now := e.Step(0).End
	mustAdd(t, e, now, waiting)
	if s := e.Stats(); s.UsedBlocks == 0 || s.Waiting != 1 {
		t.Fatalf("before abort: %+v", s)
	}
	e.Abort(now, running)
	e.Abort(now, waiting)
	e.Abort(now, waiting) // twice is harmless
	s := e.Stats()
	if s.UsedBlocks != 0 || s.Running != 0 || s.Waiting != 0 || s.Aborted != 2 || e.HasWork() {
		t.Fatalf("after abort: %+v", s)
	}
	if running.State != StateAborted || running.Finish != now {
		t.Errorf("aborted request: state %v finish %v", running.State, running.Finish)
	}
	// Its computed blocks stay cached for the next request with that prefix.
	again := newReq(3, p.BlockSize, seq(0, 320), 1)
	mustAdd(t, e, now, again)
	drain(t, e, now)
	if again.CachedTokens != 320-p.BlockSize {
		t.Errorf("cached after abort: %d, want %d", again.CachedTokens, 320-p.BlockSize)
	}
}

func TestAddRejectsBadRequests(t *testing.T) {
	p := testProfile(t, 100, 8192, 256)
	p.MaxModelLen = 1000
	tests := []struct {
		name    string
		req     Request
		wantErr error
	}{
		{"ok", Request{PromptLen: 10, MaxTokens: 10}, nil},
		{"empty prompt", Request{PromptLen: 0, MaxTokens: 10}, ErrInvalid},
		{"no output", Request{PromptLen: 10, MaxTokens: 0}, ErrInvalid},
		{"longer than context", Request{PromptLen: 990, MaxTokens: 11}, ErrTooLong},
		{"fits context exactly", Request{PromptLen: 990, MaxTokens: 10}, nil},
		{"longer than cache", Request{PromptLen: 100 * 16, MaxTokens: 1}, ErrTooLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := p
			if tt.name == "longer than cache" {
				p.MaxModelLen = 100_000
			}
			e, err := New(p)
			if err != nil {
				t.Fatal(err)
			}
			r := tt.req
			err = e.Add(0, &r)
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("Add = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestMaxNumSeqsCapsTheBatch(t *testing.T) {
	p := testProfile(t, 1000, 8192, 3)
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		mustAdd(t, e, 0, newReq(uint64(i+1), p.BlockSize, seq(i*1000, 20), 10))
	}
	now := time.Duration(0)
	for e.HasWork() {
		now = e.Step(now).End
		if s := e.Stats(); s.Running > 3 {
			t.Fatalf("%d running, max_num_seqs 3", s.Running)
		}
	}
	if s := e.Stats(); s.Finished != 5 {
		t.Fatalf("finished %d of 5", s.Finished)
	}
}

func TestStatsAddUp(t *testing.T) {
	p := testProfile(t, 200, 256, 8)
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	var reqs []*Request
	shared := seq(0, 256)
	for i := range 20 {
		prompt := append(append([]int32(nil), shared...), seq(100_000+i*1000, 37*i%200+1)...)
		r := newReq(uint64(i+1), p.BlockSize, prompt, 1+i*7%50)
		reqs = append(reqs, r)
		mustAdd(t, e, time.Duration(i)*time.Millisecond, r)
	}
	drain(t, e, 20*time.Millisecond)
	var prompt, out, cached int64
	for _, r := range reqs {
		if r.State != StateFinished || r.Output != r.MaxTokens {
			t.Fatalf("request %d: %v with %d of %d tokens", r.ID, r.State, r.Output, r.MaxTokens)
		}
		if r.FirstToken <= r.Arrival || r.Finish < r.FirstToken {
			t.Fatalf("request %d: arrival %v first %v finish %v", r.ID, r.Arrival, r.FirstToken, r.Finish)
		}
		prompt += int64(r.PromptLen)
		out += int64(r.Output)
		cached += int64(r.CachedTokens)
	}
	s := e.Stats()
	if s.PromptTokens != prompt || s.GenerationTokens != out || s.PrefixHits != cached || s.PrefixQueries != prompt {
		t.Errorf("stats %+v; want prompt %d, generated %d, hits %d", s, prompt, out, cached)
	}
	if cached == 0 {
		t.Error("the shared 256-token prefix was never reused")
	}
	if s.UsedBlocks != 0 || s.Finished != 20 || s.BusyTime <= 0 {
		t.Errorf("stats %+v", s)
	}
}

// sum16 is xxhash.Sum64 of its two words, little-endian: the block hashes
// a simulation chains do not change.
func TestSum16(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 100_000 {
		a, b := rng.Uint64(), rng.Uint64()
		if i < 3 {
			a, b = uint64(i), 0
		}
		var buf [16]byte
		binary.LittleEndian.PutUint64(buf[:8], a)
		binary.LittleEndian.PutUint64(buf[8:], b)
		if got, want := sum16(a, b), xxhash.Sum64(buf[:]); got != want {
			t.Fatalf("sum16(%#x, %#x) = %#x, xxhash %#x", a, b, got, want)
		}
	}
}
