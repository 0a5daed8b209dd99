package engine

import (
	"math"
	"testing"
	"time"
)

// The profiles of engines of other shapes (profiles.yaml, after the vLLM
// ones): each test shows the one behaviour its profile adds, against the
// default profile it is derived from.

func mustProfile(t testing.TB, name string) Profile {
	t.Helper()
	p, err := LookupProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustNew(t testing.TB, p Profile) *Engine {
	t.Helper()
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// decodeWork is a decode step of n requests of ctx tokens of context each.
func decodeWork(n, ctx int) Work {
	var w Work
	for range n {
		w.AddChunk(ctx-1, ctx)
	}
	return w
}

func TestBatchSlowdownTriplesAFullBatch(t *testing.T) {
	base, slow := mustProfile(t, DefaultProfile), mustProfile(t, "h100-llama3-8b-batch-slowdown")
	tests := []struct {
		name string
		n    int
		want float64 // step time over the default profile's
	}{
		{"lone request", 1, 1},
		{"half batch", 4, 1 + 3*2.0/7},
		{"full batch", slow.MaxNumSeqs, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := decodeWork(tt.n, 1000)
			got := float64(slow.StepTime(w)) / float64(base.StepTime(w))
			if math.Abs(got-tt.want) > 1e-6 {
				t.Errorf("%d requests: step %.4f× the default's, want %.4f×", tt.n, got, tt.want)
			}
		})
	}
	if slow.MaxNumSeqs != 8 {
		t.Errorf("max_num_seqs = %d, want 8", slow.MaxNumSeqs)
	}

	// The engine's steps, stepped and coasted, pay it too: 8 decoding
	// requests' inter-token time is 3× the default engine's.
	itl := func(p Profile, coast bool) time.Duration {
		e := mustNew(t, p)
		reqs := make([]*Request, 8)
		for i := range reqs {
			reqs[i] = newReq(uint64(i+1), p.BlockSize, seq(i*10_000, 1000), 50)
			mustAdd(t, e, 0, reqs[i])
		}
		now := e.Step(0).End // all prefills in one step
		if coast {
			now = e.Coast(now, math.MaxInt)
			e.Settle(now)
		}
		drain(t, e, now)
		return (reqs[0].Finish - reqs[0].FirstToken) / 49
	}
	for _, coast := range []bool{false, true} {
		if r := float64(itl(slow, coast)) / float64(itl(base, coast)); math.Abs(r-3) > 0.01 {
			t.Errorf("coast %v: inter-token time of a full batch %.3f× the default's, want 3×", coast, r)
		}
	}
}

func TestRequestOverheadDelaysTheFirstTokenOnly(t *testing.T) {
	base, over := mustProfile(t, DefaultProfile), mustProfile(t, "h100-llama3-8b-request-overhead")
	run := func(p Profile) (*Request, Stats, Stats) {
		e := mustNew(t, p)
		r := newReq(1, p.BlockSize, seq(0, 2000), 20)
		mustAdd(t, e, 0, r)
		added := e.Stats()
		drain(t, e, 0)
		return r, added, e.Stats()
	}
	rb, _, sb := run(base)
	ro, added, so := run(over)
	if got, want := ro.FirstToken-ro.Arrival, rb.FirstToken-rb.Arrival+150*time.Millisecond; got != want {
		t.Errorf("TTFT = %v, want the default's + 150ms = %v", got, want)
	}
	if got, want := ro.Finish-ro.FirstToken, rb.Finish-rb.FirstToken; got != want {
		t.Errorf("decode time = %v, want the default's %v: the overhead is per request, not per step", got, want)
	}
	if added.Pending != 1 || added.Waiting != 0 || added.Running != 0 {
		t.Errorf("in its overhead the request counts as pending=%d waiting=%d running=%d, want 1 0 0",
			added.Pending, added.Waiting, added.Running)
	}
	if so.BusyTime != sb.BusyTime || so.Steps != sb.Steps {
		t.Errorf("busy %v in %d steps, want the default's %v in %d: the wait is not GPU time",
			so.BusyTime, so.Steps, sb.BusyTime, sb.Steps)
	}

	// A request in its overhead does not hold up the others' steps.
	e := mustNew(t, over)
	a := newReq(1, over.BlockSize, seq(0, 100), 200)
	mustAdd(t, e, 0, a)
	now := drainUntil(t, e, 0, func() bool { return a.Output > 0 })
	b := newReq(2, over.BlockSize, seq(50_000, 100), 5)
	mustAdd(t, e, now, b)
	now = drainUntil(t, e, now, func() bool { return b.Output > 0 })
	if gap := b.FirstToken - b.Arrival; gap < 150*time.Millisecond || gap > 170*time.Millisecond {
		t.Errorf("second request's TTFT %v, want 150ms and one step", gap)
	}
	if a.Output < 15 { // 150 ms of ~7 ms steps
		t.Errorf("the first request made %d tokens meanwhile: its steps waited for the second's overhead", a.Output)
	}
	drain(t, e, now)
}

// drainUntil steps e from now until done() holds and returns the time.
func drainUntil(t testing.TB, e *Engine, now time.Duration, done func() bool) time.Duration {
	t.Helper()
	for i := 0; !done(); i++ {
		if i > 1_000_000 || !e.HasWork() {
			t.Fatal("condition never met")
		}
		now = e.Step(now).End
	}
	return now
}

func TestSlowPrefillQuartersPrefillOnly(t *testing.T) {
	base, slow := mustProfile(t, DefaultProfile), mustProfile(t, "h100-llama3-8b-slow-prefill")
	var prefill Work
	prefill.AddChunk(0, 8192)
	if r := float64(slow.StepTime(prefill)) / float64(base.StepTime(prefill)); r < 3.9 || r > 4 {
		t.Errorf("an 8k prefill chunk takes %.2f× the default's, want just under 4× (the fixed overhead is not slower)", r)
	}
	for _, n := range []int{1, 8, 32} {
		w := decodeWork(n, 1000)
		if slow.StepTime(w) != base.StepTime(w) {
			t.Errorf("a decode step of %d: %v, want the default's %v (bandwidth unchanged)", n, slow.StepTime(w), base.StepTime(w))
		}
	}
}

func TestSmallBatchQueuesBeyondMaxNumSeqs(t *testing.T) {
	p := mustProfile(t, "h100-llama3-8b-small-batch")
	e := mustNew(t, p)
	reqs := make([]*Request, 6)
	for i := range reqs {
		reqs[i] = newReq(uint64(i+1), p.BlockSize, seq(i*10_000, 200), 30)
		mustAdd(t, e, 0, reqs[i])
	}
	e.Step(0)
	if st := e.Stats(); st.Running != 4 || st.Waiting != 2 {
		t.Fatalf("running %d, waiting %d; want 4 and 2", st.Running, st.Waiting)
	}
	drain(t, e, 0)
	if reqs[4].FirstToken < reqs[0].Finish {
		t.Errorf("the fifth request started (%v) before a slot in the batch freed (%v)", reqs[4].FirstToken, reqs[0].Finish)
	}
}

func TestLlamaCppSlotsReuseOnlyTheirOwnPrefix(t *testing.T) {
	slots, vllm := mustProfile(t, "h100-llama3-8b-llamacpp-slots"), mustProfile(t, DefaultProfile)
	bs := slots.BlockSize
	prompt := seq(0, 1024)
	longer := append(append([]int32(nil), prompt...), seq(5_000_000, 64)...)

	// Sequentially: the follow-up lands in the slot that holds its prefix.
	e := mustNew(t, slots)
	a := newReq(1, bs, prompt, 10)
	mustAdd(t, e, 0, a)
	now := drain(t, e, 0)
	b := newReq(2, bs, longer, 10)
	mustAdd(t, e, now, b)
	now = drain(t, e, now)
	if b.CachedTokens != 1024 {
		t.Errorf("follow-up in the same slot: cached %d, want 1024", b.CachedTokens)
	}

	// Concurrently: a second request with the same prefix, arriving while
	// the first still runs, gets another slot and nothing from the first's
	// (vLLM's shared cache would give it the published blocks).
	for _, tt := range []struct {
		name string
		p    Profile
		want int
	}{{"slots", slots, 0}, {"vllm", vllm, 1024}} {
		e := mustNew(t, tt.p)
		a := newReq(1, bs, prompt, 100)
		mustAdd(t, e, 0, a)
		now := e.Step(0).End
		b := newReq(2, bs, longer, 10)
		mustAdd(t, e, now, b)
		drain(t, e, now)
		if b.CachedTokens != tt.want {
			t.Errorf("%s: concurrent request with a shared prefix cached %d, want %d", tt.name, b.CachedTokens, tt.want)
		}
	}

	// Four unrelated requests overwrite every slot, the least recently
	// used first: the prefix is gone, where vLLM's large cache keeps it.
	for i := range 4 {
		r := newReq(uint64(10+i), bs, seq((i+1)*100_000, 512), 5)
		mustAdd(t, e, now, r)
		now = drain(t, e, now)
	}
	c := newReq(20, bs, longer, 5)
	mustAdd(t, e, now, c)
	now = drain(t, e, now)
	if c.CachedTokens != 0 {
		t.Errorf("after four other requests: cached %d, want 0", c.CachedTokens)
	}

	// At most one request per slot; the rest wait, none is preempted.
	for i := range 6 {
		mustAdd(t, e, now, newReq(uint64(30+i), bs, seq((i+10)*100_000, 400), 50))
	}
	e.Step(now)
	if st := e.Stats(); st.Running != 4 || st.Waiting != 2 {
		t.Errorf("running %d, waiting %d; want 4 and 2", st.Running, st.Waiting)
	}
	drain(t, e, now)
	if st := e.Stats(); st.Preemptions != 0 {
		t.Errorf("%d preemptions: slots have their own KV", st.Preemptions)
	}
	if err := e.Add(now, newReq(99, bs, seq(0, 40_000), 1)); err == nil {
		t.Error("a request longer than one slot's context was accepted")
	}
}

func TestNoPrefixCachingComputesEveryPromptWhole(t *testing.T) {
	for _, tt := range []struct {
		profile    string
		wantCached bool
	}{
		{DefaultProfile, true},
		{"h100-llama3-8b-no-prefix-caching", false},
	} {
		t.Run(tt.profile, func(t *testing.T) {
			p := mustProfile(t, tt.profile)
			e := mustNew(t, p)
			first := newReq(1, p.BlockSize, seq(0, 2000), 5)
			mustAdd(t, e, 0, first)
			now := drain(t, e, 0)
			again := newReq(2, p.BlockSize, seq(0, 2000), 5)
			mustAdd(t, e, now, again)
			drain(t, e, now)
			if got := again.CachedTokens > 0; got != tt.wantCached {
				t.Errorf("the same prompt again: %d tokens cached, want cached: %v", again.CachedTokens, tt.wantCached)
			}
		})
	}
}
