package llmrouters

import (
	"math"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/routertest"
)

func costOf(t *testing.T, d router.Decision, name string) float64 {
	t.Helper()
	for _, s := range d.Scores {
		if s.Backend == name {
			return s.Cost
		}
	}
	t.Fatalf("no score for %s in %+v", name, d.Scores)
	return 0
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestSGLangCacheAware(t *testing.T) {
	cached := routertest.Words(1, 8000)
	tests := []struct {
		name       string
		loads      [3]int // in flight on b0 (which holds cached), b1, b2
		trees      [3]int // extra unrelated characters in each tree
		prompt     string
		want       string
		wantReason string
	}{
		{"imbalanced: least loaded despite the match", [3]int{40, 2, 5}, [3]int{}, cached + "x", "b1", "imbalance"},
		{"absolute gap but within 1.1×", [3]int{400, 367, 380}, [3]int{}, cached + "x", "b0", "prefix"},
		{"relative gap but within 32", [3]int{30, 0, 0}, [3]int{}, cached + "x", "b0", "prefix"},
		{"balanced, match > 0.5", [3]int{1, 0, 0}, [3]int{}, cached[:6000] + routertest.Words(9, 1000), "b0", "prefix"},
		{"balanced, match ≤ 0.5: smallest tree", [3]int{0, 0, 0}, [3]int{0, 9000, 4000}, cached[:3000] + routertest.Words(9, 5000), "b2", "low-match"},
		{"equal trees: least loaded", [3]int{1, 1, 0}, [3]int{0, 8000, 8000}, routertest.Words(9, 100), "b2", "low-match"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs := routertest.Backends(3)
			p := NewSGLangCacheAware(1, Config{})
			p.tree.insert(cached, 0)
			var flights [][]*fleet.Flight
			for i, b := range bs {
				flights = append(flights, routertest.Hold(b, tt.loads[i], 10, 100, false))
				if tt.trees[i] > 0 {
					p.tree.insert(routertest.Words(100+i, tt.trees[i]), int32(i))
				}
			}
			defer routertest.Release(flights...)
			before := p.tree.sizeOf(2)
			d := routertest.Pick(t, p, &router.Request{Prompt: tt.prompt}, bs)
			if d.Backend.Name != tt.want || d.Reason != tt.wantReason {
				t.Fatalf("picked %s (%s), want %s (%s)", d.Backend.Name, d.Reason, tt.want, tt.wantReason)
			}
			if d.Backend == bs[0] && d.Reason == "prefix" {
				if want := commonPrefix(cached, tt.prompt) / 4; d.Cached != want {
					t.Errorf("Cached = %d, want %d", d.Cached, want)
				}
			}
			// The text is inserted under the chosen worker.
			m := make([]int, 3)
			p.tree.match(tt.prompt, m)
			if m[d.Backend.Index] != len(tt.prompt) {
				t.Errorf("after the pick %s matches %d of %d characters", d.Backend.Name, m[d.Backend.Index], len(tt.prompt))
			}
			if d.Backend == bs[2] && p.tree.sizeOf(2) <= before {
				t.Errorf("b2's tree did not grow")
			}
		})
	}
}

func TestSGLangTreeEvictsLeastRecentlyUsed(t *testing.T) {
	p := NewSGLangCacheAware(1, Config{SGLang: SGLangConfig{MaxTreeChars: 10_000}})
	bs := routertest.Backends(1)
	system := routertest.Words(0, 1000)
	shared := system + routertest.Words(1, 2000)
	p.tree.insert(shared, 1) // another worker shares b0's first prompt
	var prompts []string
	for i := range 12 {
		prompts = append(prompts, system+routertest.Words(i+1, 2000))
		routertest.Pick(t, p, &router.Request{Prompt: prompts[i]}, bs)
		if n := p.tree.sizeOf(0); n > 10_000 {
			t.Fatalf("after %d prompts the tree holds %d characters, over 10,000", i+1, n)
		}
	}
	m := make([]int, 2)
	p.tree.match(prompts[11], m)
	if m[0] != len(prompts[11]) {
		t.Errorf("the newest prompt matches %d of %d", m[0], len(prompts[11]))
	}
	p.tree.match(prompts[0], m)
	// Beyond the system prompt only the first characters it shares with
	// newer prompts ("w1" of "w1_0" and "w10_0") may still match.
	if m[0] < len(system) || m[0] > len(system)+4 {
		t.Errorf("the oldest prompt matches %d, want only the shared system prompt (%d)", m[0], len(system))
	}
	if m[1] != len(shared) {
		t.Errorf("evicting b0's copy took %d of the other worker's %d characters", len(shared)-m[1], len(shared))
	}
	if p.tree.sizeOf(1) != len(shared) {
		t.Errorf("the other worker's size changed to %d", p.tree.sizeOf(1))
	}
}

func TestDynamoKVCost(t *testing.T) {
	prompt := routertest.Words(1, 640) // 10 blocks of 64 bytes, 160 tokens
	hashes := prefix.Hash(nil, prompt, peerBlockBytes)
	tests := []struct {
		name           string
		weight, temp   float64
		b1             [3]int // b1's flight: prefill, context, decoding (0/1)
		want           string
		wantReason     string
		wantB0, wantB1 float64
	}{
		// b0 holds 5 blocks; queued prefill 320 tokens (20 blocks), 800 of KV
		// (50 blocks): prefill (160−80)/16 + 20 = 25, decode 50 + 10 = 60.
		// b1: prefill 160/16 + 32/16 = 12, decode 160/16 + 10 = 20.
		{"light b1 wins", 1, 0, [3]int{32, 160, 0}, "b1", "least-cost", 85, 32},
		// b1: prefill 10 + 2000/16 = 135, decode 4000/16 + 10 = 260.
		{"cache wins over load", 1, 0, [3]int{2000, 4000, 0}, "b0", "prefix", 85, 395},
		// Weight 2: b0 = 2×25 + 60 = 110; b1 = 2×(10 + 100/16) + 4000/16 + 10.
		{"overlap weight 2", 2, 0, [3]int{100, 4000, 0}, "b0", "prefix", 110, 2*(10+100.0/16) + 260},
		// Weight 0 (negative): decode blocks only: b0 60, b1 20.
		{"weight 0: load only", -1, 0, [3]int{2000, 160, 0}, "b1", "least-cost", 60, 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs := routertest.Backends(2)
			p := NewDynamoKV(bs, 1, Config{Dynamo: DynamoConfig{OverlapWeight: tt.weight, Temperature: tt.temp}})
			p.index.insert(bs[0], hashes[:5])
			f0 := routertest.Hold(bs[0], 1, 320, 800, false)
			f1 := routertest.Hold(bs[1], 1, tt.b1[0], tt.b1[1], tt.b1[2] == 1)
			defer routertest.Release(f0, f1)
			d := routertest.Pick(t, p, &router.Request{Prompt: prompt, MaxTokens: 7}, bs)
			if c := costOf(t, d, "b0"); !near(c, tt.wantB0) {
				t.Errorf("b0 cost %v, want %v", c, tt.wantB0)
			}
			if c := costOf(t, d, "b1"); !near(c, tt.wantB1) {
				t.Errorf("b1 cost %v, want %v", c, tt.wantB1)
			}
			if d.Backend.Name != tt.want || d.Reason != tt.wantReason {
				t.Errorf("picked %s (%s), want %s (%s)", d.Backend.Name, d.Reason, tt.want, tt.wantReason)
			}
			wantCached := 0
			if d.Backend == bs[0] {
				wantCached = 80
			}
			if d.Cached != wantCached {
				t.Errorf("decision %+v", d)
			}
		})
	}
}

func TestDynamoKVTies(t *testing.T) {
	bs := routertest.Backends(2)
	p := NewDynamoKV(bs, 1, Config{})
	prompt := routertest.Words(1, 640)
	// Equal cost 30: b0 prefill 10, decode 160/16 + 10; b1 prefill 10 + 10,
	// decode 10. b1 has fewer active blocks.
	f0 := routertest.Hold(bs[0], 1, 0, 160, true)
	f1 := routertest.Hold(bs[1], 1, 160, 0, false)
	d := routertest.Pick(t, p, &router.Request{Prompt: prompt}, bs)
	if !near(costOf(t, d, "b0"), 30) || !near(costOf(t, d, "b1"), 30) || d.Backend != bs[1] {
		t.Errorf("picked %s of %+v, want b1: equal cost, fewer active blocks", d.Backend.Name, d.Scores)
	}
	routertest.Release(f0, f1)
	// Idle and nothing cached: ties break at random.
	seen := map[string]int{}
	for i := range 200 {
		seen[routertest.Pick(t, p, &router.Request{Prompt: routertest.Words(i+10, 640)}, bs).Backend.Name]++
	}
	if seen["b0"] < 60 || seen["b1"] < 60 {
		t.Errorf("idle fleet: %v", seen)
	}
}

func TestSoftmaxSample(t *testing.T) {
	r := router.NewRand(1)
	scores := []router.Score{{Cost: 85}, {Cost: 32}}
	count := func(temp float64) float64 {
		n := 0
		for range 4000 {
			if softmaxSample(scores, temp, r) == 1 {
				n++
			}
		}
		return float64(n) / 4000
	}
	// Normalised costs 1 and 0: P(b1) = 1 / (1 + e^−1/T).
	if f, want := count(1), 1/(1+math.Exp(-1)); math.Abs(f-want) > 0.03 {
		t.Errorf("T=1: cheaper one drawn %.3f of the time, want %.3f", f, want)
	}
	if f := count(0.05); f < 0.999 {
		t.Errorf("T=0.05: cheaper one drawn %.3f of the time, want nearly always", f)
	}
	if f := count(1e6); math.Abs(f-0.5) > 0.04 {
		t.Errorf("T=1e6: cheaper one drawn %.3f of the time, want about half", f)
	}
	scores[0].Cost = 32
	if f := count(0.01); math.Abs(f-0.5) > 0.04 {
		t.Errorf("equal costs: %.3f, want about half", f)
	}
}

func TestDynamoKVTemperatureSpreads(t *testing.T) {
	bs := routertest.Backends(2)
	p := NewDynamoKV(bs, 1, Config{Dynamo: DynamoConfig{Temperature: 0.5}})
	f := routertest.Hold(bs[0], 1, 160, 800, false)
	defer routertest.Release(f)
	seen := map[string]int{}
	for i := range 400 {
		seen[routertest.Pick(t, p, &router.Request{Prompt: routertest.Words(i, 640)}, bs).Backend.Name]++
	}
	// Normalised costs 1 (b0) and 0: P(b0) = e^−2 / (1 + e^−2) ≈ 0.12.
	if seen["b0"] < 20 || seen["b0"] > 80 {
		t.Errorf("picks %v: want about 48 of 400 on the costlier b0", seen)
	}
}

func TestLLMDDefaultScores(t *testing.T) {
	prompt := routertest.Words(1, 640) // 10 blocks
	hashes := prefix.Hash(nil, prompt, peerBlockBytes)
	tests := []struct {
		name       string
		b0Blocks   int
		hook       bool
		want       [3]float64
		pick       string
		wantReason string
	}{
		// queue: waiting 4, 0, 2 → 0, 1, 0.5; KV free: 0.5, 0.1, 1 − 200k/400k.
		{"scraped metrics, full match", 10, true, [3]float64{2*0 + 2*0.5 + 3*1, 2*1 + 2*0.1, 2*0.5 + 2*0.5}, "b0", "prefix"},
		{"scraped metrics, 2 of 10 blocks", 2, true, [3]float64{2*0.5 + 3*0.2, 2*1 + 2*0.1, 2*0.5 + 2*0.5}, "b1", "score"},
		// Router counts only: waiting 1, 0, 2 → 0.5, 1, 0; KV free: 1 −
		// 100k/400k, 1, 1 − 200k/400k.
		{"router counts only", 10, false, [3]float64{2*0.5 + 2*0.75 + 3*1, 2*1 + 2*1, 2*0 + 2*0.5}, "b0", "prefix"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs := routertest.Backends(3)
			scraped := map[*fleet.Backend]*fleet.Metrics{
				bs[0]: {Waiting: 4, KVUsage: 0.5},
				bs[1]: {Waiting: 0, KVUsage: 0.9},
				// b2's metrics are stale: the hook gives none.
			}
			var metrics func(*fleet.Backend) *fleet.Metrics
			if tt.hook {
				metrics = func(b *fleet.Backend) *fleet.Metrics { return scraped[b] }
			}
			p := NewLLMDDefault(bs, 1, Config{}, metrics)
			p.index.insert(bs[0], hashes[:tt.b0Blocks])
			f0 := routertest.Hold(bs[0], 1, 100, 100_000, false)
			f2 := routertest.Hold(bs[2], 2, 100, 100_000, false)
			defer routertest.Release(f0, f2)
			d := routertest.Pick(t, p, &router.Request{Prompt: prompt}, bs)
			for i, b := range bs {
				if c := costOf(t, d, b.Name); !near(-c, tt.want[i]) {
					t.Errorf("%s scored %v, want %v", b.Name, -c, tt.want[i])
				}
			}
			if d.Backend.Name != tt.pick || d.Reason != tt.wantReason {
				t.Errorf("picked %s (%s), want %s (%s)", d.Backend.Name, d.Reason, tt.pick, tt.wantReason)
			}
		})
	}
}

func TestLLMDDefaultBreaksTiesRandomly(t *testing.T) {
	bs := routertest.Backends(3)
	p := NewLLMDDefault(bs, 1, Config{}, nil)
	seen := map[string]int{}
	for i := range 300 {
		seen[routertest.Pick(t, p, &router.Request{Prompt: routertest.Words(i, 640)}, bs).Backend.Name]++
	}
	for _, b := range bs {
		if seen[b.Name] < 60 {
			t.Errorf("idle fleet, unrelated prompts: %v", seen)
		}
	}
}

func TestPrebleE2(t *testing.T) {
	prompt := routertest.Words(1, 1280) // 20 blocks, 320 tokens
	hashes := prefix.Hash(nil, prompt, peerBlockBytes)
	type gpu struct {
		blocks int // leading prompt blocks it holds
		load   int // context tokens decoding there
		kv     int // KV capacity in blocks of 16 tokens (0: 25,000)
		filler int // unrelated blocks it holds
	}
	tests := []struct {
		name       string
		gpus       [3]gpu
		want       string
		wantReason string
		wantCosts  [3]float64 // in tokens; checked when not zero
	}{
		// 12 blocks = 192 cached tokens > 128 uncached: the least loaded of
		// the holders, though b0 is lighter still.
		{"exploit", [3]gpu{{0, 0, 0, 0}, {12, 400, 0, 0}, {12, 200, 0, 0}}, "b2", "exploit", [3]float64{}},
		// 8 blocks = 128 cached ≤ 192 uncached: load + missing prefill.
		{"explore: cache outweighs load", [3]gpu{{8, 100, 0, 0}, {0, 0, 0, 0}, {0, 50, 0, 0}}, "b0", "explore", [3]float64{100 + 192, 320, 50 + 320}},
		{"explore: load outweighs cache", [3]gpu{{8, 200, 0, 0}, {0, 0, 0, 0}, {0, 50, 0, 0}}, "b1", "explore", [3]float64{200 + 192, 320, 50 + 320}},
		// b1's 20-block cache is full of other prompts: fitting 20 more
		// evicts 320 tokens.
		{"explore: eviction cost", [3]gpu{{0, 300, 0, 0}, {0, 0, 20, 20}, {0, 200, 0, 0}}, "b2", "explore", [3]float64{300 + 320, 320 + 320, 200 + 320}},
		{"explore: room, no eviction", [3]gpu{{0, 300, 0, 0}, {0, 0, 40, 20}, {0, 200, 0, 0}}, "b1", "explore", [3]float64{300 + 320, 320, 200 + 320}},
		// The holder carries over 1.5× the lightest's load and more than
		// this request adds to it (320 + 320 tokens).
		{"rebalance", [3]gpu{{20, 10_000, 0, 0}, {0, 1000, 0, 0}, {0, 3000, 0, 0}}, "b1", "rebalance", [3]float64{}},
		{"within 1.5×: exploit", [3]gpu{{20, 1400, 0, 0}, {0, 1000, 0, 0}, {0, 3000, 0, 0}}, "b0", "exploit", [3]float64{}},
		{"gap below one request: exploit", [3]gpu{{20, 600, 0, 0}, {0, 0, 0, 0}, {0, 3000, 0, 0}}, "b0", "exploit", [3]float64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs := routertest.Backends(3)
			for i, g := range tt.gpus {
				if g.kv > 0 {
					bs[i].SetInfo(&fleet.Info{Models: []string{"m"}, BlockSize: 16, KVBlocks: g.kv})
				}
			}
			p := NewPrebleE2(bs, 1, Config{})
			var flights [][]*fleet.Flight
			for i, g := range tt.gpus {
				if g.filler > 0 {
					p.index.insert(bs[i], prefix.Hash(nil, routertest.Words(50+i, g.filler*peerBlockBytes), peerBlockBytes))
				}
				p.index.insert(bs[i], hashes[:g.blocks])
				if g.load > 0 {
					flights = append(flights, routertest.Hold(bs[i], 1, 0, g.load, true))
				}
			}
			defer routertest.Release(flights...)
			d := routertest.Pick(t, p, &router.Request{Prompt: prompt}, bs)
			if d.Backend.Name != tt.want || d.Reason != tt.wantReason {
				t.Errorf("picked %s (%s), want %s (%s); scores %+v", d.Backend.Name, d.Reason, tt.want, tt.wantReason, d.Scores)
			}
			for i, want := range tt.wantCosts {
				if want == 0 {
					continue
				}
				if c := costOf(t, d, bs[i].Name) * prebleRate; math.Abs(c-want) > 1e-6 {
					t.Errorf("%s cost %v tokens, want %v", bs[i].Name, c, want)
				}
			}
			if want := tt.gpus[d.Backend.Index].blocks * 16; d.Cached != want {
				t.Errorf("Cached = %d, want %d", d.Cached, want)
			}
		})
	}
}

func TestPrebleE2SpreadsHotPrefix(t *testing.T) {
	bs := routertest.Backends(4)
	r := router.NewRouter(NewPrebleE2(bs, 1, Config{}), nil)
	system := routertest.Words(0, 16_000)
	used := map[string]int{}
	var flights []*router.Ticket
	for i := range 80 {
		d := routertest.Route(t, r, &router.Request{Prompt: system + routertest.Words(i+1, 400), MaxTokens: 100}, bs)
		used[d.Backend.Name]++
		flights = append(flights, d)
	}
	for _, f := range flights {
		f.Finish(router.Failed(499))
	}
	if len(used) != 4 {
		t.Errorf("a hot prefix under load used %v", used)
	}
}
