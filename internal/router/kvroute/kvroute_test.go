package kvroute

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/routertest"
)

func TestKVRouteTiesGoToTheCache(t *testing.T) {
	bs := routertest.Backends(4)
	p := New(bs, Config{Seed: 1, Now: frozenClock})
	// A 64-token shared head saves a few milliseconds of prefill: within
	// the tie tolerance, yet the backend holding it must win the tie.
	head := routertest.Words(0, 256)
	holder := routertest.Pick(t, p, &router.Request{Prompt: head + routertest.Words(1, 100)}, bs).Backend
	for i := range 50 {
		d := routertest.Pick(t, p, &router.Request{Prompt: head + routertest.Words(i+2, 100)}, bs)
		if d.Backend != holder {
			t.Fatalf("request %d went to %s, away from %s that holds its head", i, d.Backend.Name, holder.Name)
		}
	}
}

func TestKVRouteForgetsTokenBlocksOfFailedRequest(t *testing.T) {
	bs := routertest.Backends(2)
	r := newKVRouter(bs, Config{Seed: 1, Now: frozenClock})
	blocks := make([]uint64, 64)
	for i := range blocks {
		blocks[i] = uint64(i + 1)
	}
	req := func() *router.Request {
		return &router.Request{PromptTokens: 1024, TokenBlocks: blocks, TokenBlockSize: 16}
	}
	d := routertest.Route(t, r, req(), bs)
	d.Finish(router.Failed(0))
	again := routertest.Route(t, r, req(), bs)
	again.Finish(router.Failed(499))
	if s := scoreOf(t, again.Decision, d.Backend); s.Cached != 0 {
		t.Errorf("%s is still predicted to hold %d tokens of a prompt it never saw", d.Backend.Name, s.Cached)
	}
}

// smallCache gives every backend of bs 2,560 tokens of KV: an index of 40
// blocks of 256 bytes, and a memory of what it held lately of 80.
func smallCache(bs []*fleet.Backend) {
	for _, b := range bs {
		b.SetInfo(&fleet.Info{Models: []string{"m"}, BlockSize: 16, KVBlocks: 160})
	}
}

func TestKVRouteRemembersBeyondTheIndex(t *testing.T) {
	bs := routertest.Backends(4)
	smallCache(bs)
	r := newKVRouter(bs, Config{Seed: 1, Now: frozenClock})
	conv := routertest.Words(0, 16_000) // 4k tokens, 62 blocks: more than the index keeps
	first := routertest.Route(t, r, &router.Request{Prompt: conv}, bs)
	// Served: the index learns the backend's real capacity and forgets
	// part of the conversation; recent does not.
	first.Finish(served(4000, 0, 100*time.Millisecond))
	d := routertest.Route(t, r, &router.Request{Prompt: conv + routertest.Words(1, 400)}, bs)
	d.Finish(router.Failed(499))
	if d.Backend != first.Backend {
		t.Fatalf("turn 2 went to %s, away from %s that probably still holds turn 1", d.Backend.Name, first.Backend.Name)
	}
	// Counted as a miss but for the blocks the index kept: the queue behind
	// it must not be underestimated.
	if d.Cached > 40*64 {
		t.Errorf("counted %d cached tokens where the index holds at most 40 blocks", d.Cached)
	}
	if s := scoreOf(t, d.Decision, first.Backend); s.Cached <= d.Cached {
		t.Errorf("score %+v: recent's memory is worth nothing beyond the index's %d tokens", s, d.Cached)
	}
}

func TestKVRouteLearnsWhatRecentMemoryIsWorth(t *testing.T) {
	for _, tt := range []struct {
		name   string
		cached bool
		rises  bool
	}{
		{name: "still cached", cached: true, rises: true},
		{name: "evicted", cached: false, rises: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bs := routertest.Backends(1)
			smallCache(bs)
			r := newKVRouter(bs, Config{Seed: 1, Now: frozenClock})
			// What kvroute expects cached of a turn whose previous turn only
			// recent remembers whole, at its first and its last outcome.
			var worth []int
			for i := range 20 {
				conv := routertest.Words(i, 16_000)
				routertest.Route(t, r, &router.Request{Prompt: conv}, bs).Finish(served(4000, 0, 100*time.Millisecond))
				d := routertest.Route(t, r, &router.Request{Prompt: conv + routertest.Words(100+i, 400)}, bs)
				s := scoreOf(t, d.Decision, bs[0])
				if s.Cached <= d.Cached {
					t.Fatalf("turn %d: recent predicts nothing beyond the index (%+v)", i, s)
				}
				worth = append(worth, s.Cached-d.Cached)
				cached := 0
				if tt.cached {
					cached = 4000
				}
				d.Finish(served(4100, cached, 100*time.Millisecond))
			}
			before, after := worth[0], worth[len(worth)-1]
			if (after > before) != tt.rises {
				t.Errorf("recent's memory worth %d tokens, then %d", before, after)
			}
		})
	}
}

// newKVRouter returns a Router driving a kvroute policy configured by cfg,
// the two sharing one token estimator as New makes them.
func newKVRouter(bs []*fleet.Backend, cfg Config) *router.Router {
	cfg.Tokens = router.NewTokens()
	return router.NewRouter(New(bs, cfg), cfg.Tokens)
}

// served is the outcome of a request served in full with cached of its
// prompt tokens found in the cache.
func served(prompt, cached int, ttft time.Duration) router.Outcome {
	return router.Outcome{Status: 200, PromptTokens: prompt, CachedTokens: cached, CompletionTokens: 1, TTFT: ttft, Latency: ttft}
}

// scoreOf returns the score of backend b in d.
func scoreOf(t *testing.T, d router.Decision, b *fleet.Backend) router.Score {
	t.Helper()
	for _, s := range d.Scores {
		if s.Backend == b.Name {
			return s
		}
	}
	t.Fatalf("no score for %s in %+v", b.Name, d.Scores)
	return router.Score{}
}

func TestKVRouteKeepsConversationOnItsBackend(t *testing.T) {
	bs := routertest.Backends(4)
	r := newKVRouter(bs, Config{Seed: 1, Now: frozenClock})
	system := routertest.Words(0, 2000)
	for conv := range 20 {
		turn1 := system + routertest.Words(conv+1, 3000)
		d1 := routertest.Route(t, r, &router.Request{Prompt: turn1}, bs)
		d1.Finish(router.Failed(499)) // the client went away: nothing learned
		turn2 := turn1 + routertest.Words(100+conv, 600)
		d2 := routertest.Route(t, r, &router.Request{Prompt: turn2}, bs)
		d2.Finish(router.Failed(499))
		if d2.Backend != d1.Backend || d2.Reason != "prefix" {
			t.Fatalf("conversation %d: turn 1 on %s, turn 2 on %s (%s)", conv, d1.Backend.Name, d2.Backend.Name, d2.Reason)
		}
		if d2.Cached < len(turn1)/4-64 {
			t.Errorf("conversation %d: predicted %d cached tokens of turn 1's %d", conv, d2.Cached, len(turn1)/4)
		}
	}
}

func TestKVRouteSpreadsHotPrefixWhenItsBackendSaturates(t *testing.T) {
	bs := routertest.Backends(4)
	r := newKVRouter(bs, Config{Seed: 1, Now: frozenClock})
	system := routertest.Words(0, 16_000) // 4k tokens shared by everyone
	var flights []*router.Ticket
	used := map[string]int{}
	reasons := map[string]int{}
	// 120 requests arrive together and none finishes: the first backend's
	// queue grows until prefilling the prefix elsewhere (and paying the miss
	// penalty) is cheaper.
	for i := range 120 {
		d := routertest.Route(t, r, &router.Request{Prompt: system + routertest.Words(i+1, 400)}, bs)
		flights = append(flights, d)
		used[d.Backend.Name]++
		reasons[d.Reason]++
	}
	t.Logf("used %v, reasons %v", used, reasons)
	if len(used) != 4 {
		t.Errorf("a saturated hot prefix used %d backends: %v", len(used), used)
	}
	for name, n := range used {
		if n > 45 {
			t.Errorf("%s took %d of 120: hot spot", name, n)
		}
	}
	// Most requests still reuse the prefix somewhere: only the first request
	// on each backend pays for it.
	if reasons["prefix"] < 110 {
		t.Errorf("reasons %v: want at least 110 prefix hits", reasons)
	}
	for _, f := range flights {
		f.Finish(router.Failed(499))
	}
}

func TestKVRouteTiesBreakRandomly(t *testing.T) {
	bs := routertest.Backends(4)
	p := New(bs, Config{Seed: 1, Now: frozenClock})
	seen := map[string]int{}
	for i := range 400 {
		seen[routertest.Pick(t, p, &router.Request{Prompt: routertest.Words(i, 100)}, bs).Backend.Name]++
	}
	for _, b := range bs {
		if seen[b.Name] < 60 {
			t.Errorf("%s got %d of 400 unrelated short prompts: %v", b.Name, seen[b.Name], seen)
		}
	}
}

func TestKVRouteRespectsLoadBound(t *testing.T) {
	bs := routertest.Backends(4)
	r := newKVRouter(bs, Config{Seed: 1, LoadFactor: 1.5, Now: frozenClock})
	prompt := routertest.Words(0, 40_000)
	var flights []*router.Ticket
	used := map[*fleet.Backend]bool{}
	for range 40 {
		// The same long prompt every time: the cache pulls to one backend,
		// but its queue is fixed at zero (prefill released at once), so only
		// the bound can move requests elsewhere.
		d := routertest.Route(t, r, &router.Request{Prompt: prompt}, bs)
		d.FirstToken()
		flights = append(flights, d)
		used[d.Backend] = true
		var total int64
		for _, b := range bs {
			total += b.Load().Requests
		}
		for _, b := range bs {
			if n := b.Load().Requests; float64(n) > 1.5*float64(total)/4+loadSlack {
				t.Fatalf("%s has %d of %d in flight: over 1.5 × mean + %d", b.Name, n, total, loadSlack)
			}
		}
	}
	if len(used) < 2 {
		t.Errorf("all 40 on one backend: the bound never moved a request")
	}
	for _, f := range flights {
		f.Finish(router.Failed(499))
	}
}

func TestKVRouteLearnsPrefillSpeed(t *testing.T) {
	bs := routertest.Backends(2)
	r := newKVRouter(bs, Config{Seed: 1, Now: frozenClock})
	// Backend 1 is three times slower: 10k tokens/s against 30k, with 50 ms
	// of overhead on both.
	rates := []float64{30_000, 10_000}
	for i := range 200 {
		for _, b := range bs {
			work := float64(500 + (i*997)%8000)
			ttft := 0.05 + work/rates[b.Index]
			// Routed to b alone, finished at once: nothing queued ahead.
			tk := routertest.Route(t, r, &router.Request{Prompt: routertest.Words(i, 4*int(work))}, []*fleet.Backend{b})
			tk.Finish(served(int(work), 0, time.Duration(ttft*float64(time.Second))))
		}
	}
	// The pooled fit lies between the two; each backend's slowness relative
	// to the fleet puts its predictions on its own speed.
	work := 8000
	d := routertest.Route(t, r, &router.Request{Prompt: routertest.Words(999, 4*work)}, bs)
	d.Finish(router.Failed(499))
	var pred [2]float64
	for _, b := range bs {
		pred[b.Index] = scoreOf(t, d.Decision, b).TTFT.Seconds()
	}
	t.Logf("predicted %v s for %v tokens", pred, work)
	if r := pred[1] / pred[0]; r < 2 || r > 3.3 {
		t.Errorf("predicted %v s for %v tokens: slow/fast %.2f, want about %.2f", pred, work, r, (0.05+float64(work)/10_000)/(0.05+float64(work)/30_000))
	}
	// With equal, empty queues a fresh 4k-token prompt goes to the fast one.
	for i := range 20 {
		d := routertest.Route(t, r, &router.Request{Prompt: routertest.Words(1000+i, 16_000)}, bs)
		d.Finish(router.Failed(499))
		if d.Backend != bs[0] {
			t.Fatalf("picked the slow backend for a long prompt")
		}
	}
}

// A backend whose cache turns out to hold less than the index predicted
// (it serves other traffic, or its cache is smaller than it says) gets a
// smaller index: what the index forgets is no longer predicted cached.
func TestKVRouteShrinksIndexOnMissedPrediction(t *testing.T) {
	bs := routertest.Backends(1)
	// 2,000 tokens of KV: an index of 31 blocks of 256 bytes, the prompt's.
	bs[0].SetInfo(&fleet.Info{Models: []string{"m"}, BlockSize: 16, KVBlocks: 125})
	r := newKVRouter(bs, Config{Seed: 1, Now: frozenClock})
	prompt := routertest.Words(0, 8000)
	routertest.Route(t, r, &router.Request{Prompt: prompt}, bs).Finish(served(2000, 0, 100*time.Millisecond))
	before := routertest.Route(t, r, &router.Request{Prompt: prompt}, bs)
	if before.Cached < 1900 {
		t.Fatalf("predicted %d cached tokens of a prompt just served, want its 31 blocks", before.Cached)
	}
	// The backend reports no cached tokens where 1,984 were predicted.
	before.Finish(served(2000, 0, 100*time.Millisecond))
	after := routertest.Route(t, r, &router.Request{Prompt: prompt}, bs)
	after.Finish(router.Failed(499))
	if after.Cached >= before.Cached {
		t.Errorf("predicted %d cached tokens after a missed prediction, want fewer than %d", after.Cached, before.Cached)
	}
}

func TestSpeedLearnsDecodeSlowdown(t *testing.T) {
	s := newSpeed()
	for i := range 400 {
		work := float64(200 + (i*997)%9000)
		decoding := float64((i * 31) % 120)
		// With the prior's attention term: prompts this short cannot tell
		// it apart from the linear one.
		s.observe(work, 0, decoding, 0.03+work/20_000+work*work/2/priorAttn+decoding*0.002)
	}
	if r := s.rate / 20_000; r < 0.95 || r > 1.05 {
		t.Errorf("rate %.0f tokens/s, want 20,000", s.rate)
	}
	if s.perDecode < 0.0019 || s.perDecode > 0.0021 {
		t.Errorf("slowdown %.5f s per decoding request, want 0.002", s.perDecode)
	}
	if s.overhead < 0.025 || s.overhead > 0.035 {
		t.Errorf("overhead %.3f s, want 0.03", s.overhead)
	}
}

// Long prompts take more than their length at the short ones' rate:
// attention grows with the square of the context, and a cached prefix is
// context too. The fit recovers both terms from prompts of mixed lengths.
func TestSpeedLearnsAttention(t *testing.T) {
	const rate, attn = 25_000.0, 25_000.0 * 20_000
	truth := func(m, c float64) float64 { return 0.02 + m/rate + m*(c+m/2)/attn }
	s := newSpeed()
	for i := range 400 {
		m := float64(500 + (i*7919)%100_000)
		c := float64((i * 104_729) % 40_000)
		s.observe(m, c, 0, truth(m, c))
	}
	for _, tc := range []struct{ m, c float64 }{{1000, 0}, {30_000, 0}, {120_000, 0}, {10_000, 80_000}} {
		got, want := s.predict(tc.m, tc.c, 0), truth(tc.m, tc.c)
		if math.Abs(got-want) > 0.05*want {
			t.Errorf("%v tokens after %v cached: predicted %.3f s, want %.3f", tc.m, tc.c, got, want)
		}
	}
}

func TestKVRouteAvoidsBusyDecoders(t *testing.T) {
	bs := routertest.Backends(2)
	p := New(bs, Config{Seed: 1, Now: frozenClock})
	// b0 has 40 requests past their first token; b1 none. Nothing is queued
	// for prefill on either, and the load bound is loose enough to allow b0.
	var flights []*fleet.Flight
	for range 40 {
		f := bs[0].Start(0, 1000)
		f.FirstToken()
		flights = append(flights, f)
	}
	for i := range 20 {
		if d := routertest.Pick(t, p, &router.Request{Prompt: routertest.Words(i, 2000)}, bs); d.Backend != bs[1] {
			t.Fatalf("a fresh prompt went to the backend with 40 decoding requests")
		}
	}
	for _, f := range flights {
		f.Done()
	}
}

func TestKVRouteForgetsPromptOfFailedRequest(t *testing.T) {
	bs := routertest.Backends(2)
	r := newKVRouter(bs, Config{Seed: 1, Now: frozenClock})
	prompt := routertest.Words(0, 8000)
	d := routertest.Route(t, r, &router.Request{Prompt: prompt}, bs)
	d.Finish(router.Failed(0))
	again := routertest.Route(t, r, &router.Request{Prompt: prompt}, bs)
	again.Finish(router.Failed(499))
	if s := scoreOf(t, again.Decision, d.Backend); s.Cached != 0 {
		t.Errorf("%s is still predicted to hold %d tokens of a prompt it never saw", d.Backend.Name, s.Cached)
	}
}

func TestKVRouteWaitsForKVMemory(t *testing.T) {
	bs := routertest.Backends(2) // 400k tokens of KV each
	r := newKVRouter(bs, Config{Seed: 1, Now: frozenClock})
	prompt := routertest.Words(0, 40_000) // about 10k tokens
	d := routertest.Route(t, r, &router.Request{Prompt: prompt}, bs)
	d.Finish(router.Failed(499))
	cached := d.Backend
	other := bs[1-cached.Index]
	// The cached backend's requests need 600k tokens of KV, 200k more than
	// it has (nothing queued for prefill: they wait for memory, not for
	// compute): the prompt would wait for a third of the cache to drain.
	f := cached.Start(0, 600_000)
	f.FirstToken()
	if d := routertest.Route(t, r, &router.Request{Prompt: prompt, MaxTokens: 500}, bs); d.Backend != other {
		t.Errorf("went to %s (%s) although its KV is oversubscribed; cost %+v", d.Backend.Name, d.Reason, d.Scores)
	} else {
		d.Finish(router.Failed(499))
	}
	f.Done()
	// With room again, the prefix wins (both hold it now).
	req := &router.Request{Prompt: prompt, MaxTokens: 500}
	if d := routertest.Route(t, r, req, bs); d.Cached < req.PromptTokens/2 {
		t.Errorf("with free KV the cached prefix should win, went to %s with %d of %d tokens cached", d.Backend.Name, d.Cached, req.PromptTokens)
	}
}

// A long prompt half computed is half the wait: the queue estimate drains at
// the learned rate from the moment work was sent, so a request goes to the
// backend whose earlier prompt is nearly done, not the one that just took a
// shorter prompt, although the router's count of unanswered prefill says the
// opposite.
func TestKVRouteDrainsQueuedPrefill(t *testing.T) {
	bs := routertest.Backends(2)
	now := time.Unix(1000, 0)
	r := newKVRouter(bs, Config{Seed: 1, Now: func() time.Time { return now }})
	// 30k tokens at the prior's 30k tokens/s, and as much again for
	// attention: 1.5 s of prefill.
	first := routertest.Route(t, r, &router.Request{Prompt: routertest.Words(1, 4*30_000)}, bs)
	defer first.Finish(router.Failed(499))
	other := bs[1-first.Backend.Index]
	now = now.Add(1400 * time.Millisecond)
	second := routertest.Route(t, r, &router.Request{Prompt: routertest.Words(2, 4*20_000)}, bs)
	if second.Backend != other {
		t.Fatalf("20k-token prompt went to %s, behind 0.1 s of prefill, not to the idle %s", second.Backend.Name, other.Name)
	}
	defer second.Finish(router.Failed(499))
	now = now.Add(200 * time.Millisecond)
	// Counted: 30k tokens unanswered on the first, 20k on the other.
	// Left: nothing on the first, 0.7 s on the other.
	third := routertest.Route(t, r, &router.Request{Prompt: routertest.Words(3, 4*10_000)}, bs)
	defer third.Finish(router.Failed(499))
	if third.Backend != first.Backend {
		t.Errorf("10k-token prompt went to %s (scores %+v), want %s whose prompt is done", third.Backend.Name, third.Scores, first.Backend.Name)
	}
	// Its own 10k tokens at 30k tokens/s, 56 ms of attention and the
	// prior's 20 ms: nothing ahead of it.
	if want := 420 * time.Millisecond; third.PredictedTTFT > want {
		t.Errorf("predicted TTFT %v, want at most %v: nothing left ahead", third.PredictedTTFT, want)
	}
}

// An engine with a fixed number of slots (llama.cpp) queues requests beyond
// them whole: a backend whose slots are all taken costs a slot's wait even
// with the prompt cached there.
func TestKVRouteWaitsForASlot(t *testing.T) {
	bs := routertest.Backends(2)
	slots := map[*fleet.Backend]*fleet.Metrics{bs[0]: {Slots: 4}, bs[1]: {Slots: 4}}
	p := New(bs, Config{Seed: 1, Metrics: func(b *fleet.Backend) *fleet.Metrics { return slots[b] }, Now: frozenClock})
	prompt := routertest.Words(0, 8000) // about 2k tokens: 0.07 s to prefill
	d := routertest.Pick(t, p, &router.Request{Prompt: prompt}, bs)
	cached, other := d.Backend, bs[1-d.Backend.Index]
	var held []*fleet.Flight
	for range 3 {
		f := cached.Start(0, 1000)
		f.FirstToken()
		held = append(held, f)
	}
	if d := routertest.Pick(t, p, &router.Request{Prompt: prompt}, bs); d.Backend != cached {
		t.Fatalf("with a slot free the cached backend should win, went to %s", d.Backend.Name)
	}
	f := cached.Start(0, 1000)
	f.FirstToken()
	held = append(held, f)
	if d := routertest.Pick(t, p, &router.Request{Prompt: prompt}, bs); d.Backend != other {
		t.Errorf("all 4 slots of %s taken, yet it got the request: %+v", cached.Name, d.Scores)
	}
	for _, f := range held {
		f.Done()
	}
}

// A kvroute decision among many candidates explains itself with the chosen
// one and the cheapest others, cheapest first; among few, with all of them.
func TestKVRouteExplainsTheCheapest(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 5))
	for _, n := range []int{5, 32, 33, 1000} {
		cand := make([]candidate, n)
		cands := make([]*fleet.Backend, n)
		for i := range cand {
			cand[i].cost = float64(rng.IntN(50)) // ties among the cheapest too
			cands[i] = fleet.NewBackend(i, fmt.Sprint(i), nil)
		}
		best := rng.IntN(n)
		got := explain(cand, cands, best)
		if n <= maxScores {
			if len(got) != n || got[best].Backend != cands[best].Name {
				t.Fatalf("%d candidates: %d scores, want all", n, len(got))
			}
			continue
		}
		if len(got) != maxScores || got[0].Backend != cands[best].Name {
			t.Fatalf("%d candidates: %d scores, first %s; want %d, first the chosen %s", n, len(got), got[0].Backend, maxScores, cands[best].Name)
		}
		var others []float64
		for i := range cand {
			if i != best {
				others = append(others, cand[i].cost)
			}
		}
		slices.Sort(others)
		for k, s := range got[1:] {
			if s.Cost != others[k] {
				t.Fatalf("%d candidates: score %d costs %v, want the %d-th cheapest %v", n, k+1, s.Cost, k+1, others[k])
			}
		}
	}
}

// frozenClock stands still: requests arrive at one instant, and no queue
// drains however slowly a test runs (under the race detector, on a busy
// machine).
func frozenClock() time.Time { return time.Unix(1000, 0) }
