package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/shareddata/sharedtest"
	"github.com/kvroute/kvroute/internal/workload"
)

func profile(t testing.TB) engine.Profile {
	t.Helper()
	p, err := engine.LookupProfile(engine.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The queue pops events by time, and in push order among equal times.
func TestQueueOrder(t *testing.T) {
	var q queue
	rng := rand.New(rand.NewPCG(1, 2))
	type key struct {
		at  time.Duration
		idx int32
	}
	var want []key
	for i := range 2000 {
		at := time.Duration(rng.IntN(50))
		q.push(at, evSend, int32(i))
		want = append(want, key{at, int32(i)})
	}
	slices.SortStableFunc(want, func(a, b key) int { return int(a.at - b.at) })
	for i, w := range want {
		ev := q.pop()
		if ev.at != w.at || ev.idx != w.idx {
			t.Fatalf("pop %d: (%v, %d), want (%v, %d)", i, ev.at, ev.idx, w.at, w.idx)
		}
	}
	if q.len() != 0 {
		t.Fatalf("%d events left", q.len())
	}
}

func chatWorkload(t testing.TB, sessions int) workload.Workload {
	t.Helper()
	cfg := workload.DemoChat()
	cfg.Sessions, cfg.Span = sessions, 20*time.Second
	return workload.Workload{Name: "chat", Sessions: workload.Chat(cfg, 1)}
}

// The same configuration gives the same results, request for request.
func TestDeterministic(t *testing.T) {
	cfg := Config{Workload: chatWorkload(t, 40), Backends: 3, Routers: 2, Profile: profile(t),
		Policies: []string{"kvroute", "llmd-default"}, Seed: 7}
	a, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.Runs {
		if !reflect.DeepEqual(a.Runs[i].Requests, b.Runs[i].Requests) {
			t.Errorf("%s: two runs differ", a.Runs[i].Policy)
		}
		if n := a.Runs[i].Summary.Requests; n != 240 || a.Runs[i].Summary.Errors != 0 {
			t.Errorf("%s: %d requests, %d errors; want 240, 0", a.Runs[i].Policy, n, a.Runs[i].Summary.Errors)
		}
	}
}

// traceWorkload is a small Mooncake-like trace: requests sharing leading
// blocks in a few groups, described by block ids only.
func traceWorkload(n int, gap time.Duration) workload.Workload {
	rng := rand.New(rand.NewPCG(5, 6))
	var w workload.Workload
	for i := range n {
		shared := uint64(rng.IntN(4))
		ids := []uint64{shared<<32 | 1, shared<<32 | 2}
		for range 2 + rng.IntN(6) {
			ids = append(ids, rng.Uint64())
		}
		w.Sessions = append(w.Sessions, workload.Session{ID: "r", Start: time.Duration(i) * gap, Turns: []workload.Turn{{
			Blocks: ids, BlockTokens: 512, Tokens: 512*len(ids) - rng.IntN(500), MaxTokens: 1 + rng.IntN(200),
		}}})
	}
	w.Name = "trace"
	return w
}

// Token mode replays block-described requests without text; tiling plays
// independent copies: twice the requests, none sharing blocks across
// copies, so the hit rate stays about what one copy gets.
func TestTokenModeAndTiling(t *testing.T) {
	w := traceWorkload(300, 100*time.Millisecond)
	cfg := Config{Workload: w, Backends: 4, Profile: profile(t), Policies: []string{"kvroute", "kvroute:ttft", "round-robin"}, Seed: 1}
	if !tokenMode(cfg) {
		t.Fatal("a block-described single-turn workload should run in token mode")
	}
	one, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Tile, cfg.Backends = 2, 8
	two, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range one.Runs {
		a, b := one.Runs[i].Summary, two.Runs[i].Summary
		t.Logf("%s: hit rate %.1f %% (1 copy, 4 servers), %.1f %% (2 copies, 8 servers)", a.Name, 100*a.HitRate, 100*b.HitRate)
		if a.Requests != 300 || b.Requests != 600 || a.Errors+b.Errors != 0 {
			t.Fatalf("%s: %d and %d requests, %d errors", a.Name, a.Requests, b.Requests, a.Errors+b.Errors)
		}
		if a.HitRate <= 0 || b.HitRate > a.HitRate*1.5 {
			t.Errorf("%s: hit rate %.3f with one copy, %.3f with two", a.Name, a.HitRate, b.HitRate)
		}
	}
	// kvroute's time to first token keeps shared prefixes together; round
	// robin scatters them. (Its default objective weighs these prefixes,
	// 1k tokens, 30 ms of prefill, against the streams' load and spreads
	// them as round robin does.)
	if kv, rr := one.Runs[1].Summary.HitRate, one.Runs[2].Summary.HitRate; kv <= rr {
		t.Errorf("kvroute hit rate %.3f, round robin %.3f", kv, rr)
	}
	if one.Bounds.Ideal <= 0 || one.Bounds.Ideal > one.Bounds.Unlimited {
		t.Errorf("bounds %+v", one.Bounds)
	}
}

// Closed loop: at most Users sessions are in flight at once, and every
// session is played.
func TestClosedLoop(t *testing.T) {
	cfg := Config{Workload: chatWorkload(t, 30), Backends: 2, Profile: profile(t), Policies: []string{"least-request"}, Users: 3, Seed: 1}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	rs := rep.Runs[0].Requests
	if len(rs) != 180 {
		t.Fatalf("%d requests, want 180", len(rs))
	}
	// Count the sessions in flight at each request's send time.
	for _, r := range rs {
		open := map[int]bool{}
		for _, o := range rs {
			if o.Sent <= r.Sent && r.Sent < o.Sent+o.E2E {
				open[o.Session] = true
			}
		}
		if len(open) > 3 {
			t.Fatalf("%d sessions in flight at %v, want at most 3", len(open), r.Sent)
		}
	}
}

// FindBackends returns the smallest fleet meeting the objective: one more
// server less misses it, and the search tried no size twice.
func TestFindBackends(t *testing.T) {
	w := traceWorkload(200, 40*time.Millisecond)
	cfg := Config{Workload: w, Profile: profile(t), Policies: []string{"round-robin"}, Seed: 1}
	const slo = 400 * time.Millisecond
	found, err := FindBackends(context.Background(), cfg, FindConfig{SLO: slo, Max: 64}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := found[0]
	if f.Backends < 2 || f.TTFTP99 > slo {
		t.Fatalf("found %d servers with p99 %v; trials %+v", f.Backends, f.TTFTP99, f.Trials)
	}
	seen := map[int]bool{}
	missedBelow := false
	for _, tr := range f.Trials {
		if seen[tr.Backends] {
			t.Errorf("tried %d twice", tr.Backends)
		}
		seen[tr.Backends] = true
		if tr.Backends == f.Backends-1 && !tr.Met {
			missedBelow = true
		}
	}
	if !missedBelow {
		t.Errorf("%d servers met the objective but %d was not shown to miss it: %+v", f.Backends, f.Backends-1, f.Trials)
	}
}

// Taking runs of decode steps as one event (engine.Engine.Coast) changes
// no result: every request's timings, backend and cached tokens, and every
// load sample, are those of stepping through every step.
func TestCoastingChangesNothing(t *testing.T) {
	configs := []Config{
		{Workload: chatWorkload(t, 40), Backends: 3, Routers: 2, Policies: []string{"kvroute", "least-request"}, Profile: profile(t)},
		{Workload: traceWorkload(300, 50*time.Millisecond), Backends: 4, Policies: []string{"kvroute", "round-robin"}, Profile: profile(t)},
		{Workload: chatWorkload(t, 40), Backends: 4, Prefill: 1, Policies: []string{"kvroute@priced", "kvroute@always"}, Profile: profile(t)},
	}
	if !raceEnabled {
		// The real trace on 64 servers (7,344 requests), with 16- and
		// 512-token blocks: long decodes, evictions, many servers.
		w, err := workload.Load("mooncake:"+sharedtest.Require(t, "mooncake/conversation_trace.jsonl"),
			workload.Options{Duration: 5 * time.Minute, Compress: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, bs := range []int{16, 512} {
			configs = append(configs, Config{Workload: w, Backends: 64, Tile: 8, Policies: []string{"kvroute"},
				Profile: profile(t).WithBlockSize(bs), BoundsLimit: -1})
		}
	}
	for _, cfg := range configs {
		cfg.Seed, cfg.Sample = 3, 100*time.Millisecond
		coasting, stepsA, err := RunStats(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		cfg.stepwise = true
		stepping, stepsB, err := RunStats(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range coasting.Runs {
			a, b := coasting.Runs[i], stepping.Runs[i]
			t.Logf("%s, %s: %d events coasting, %d stepping", cfg.Workload.Name, a.Policy, stepsA[i].Events, stepsB[i].Events)
			if !reflect.DeepEqual(a.Requests, b.Requests) {
				t.Errorf("%s, %s: requests differ", cfg.Workload.Name, a.Policy)
			}
			if !reflect.DeepEqual(a.Backends, b.Backends) {
				t.Errorf("%s, %s: backends differ", cfg.Workload.Name, a.Policy)
			}
			if stepsA[i].Steps != stepsB[i].Steps || stepsA[i].Events*2 > stepsB[i].Events {
				t.Errorf("%s, %s: %d steps in %d events coasting, %d in %d stepping", cfg.Workload.Name, a.Policy,
					stepsA[i].Steps, stepsA[i].Events, stepsB[i].Steps, stepsB[i].Events)
			}
		}
	}
}

// A burst of requests sharing one long system prompt spreads over the fleet
// instead of piling onto the backend that cached it first, and still reuses
// the prefix: it is prefilled on few backends and hit by most requests.
// (In virtual time: on the wall clock, how far the first backend's queue
// had drained depended on the machine's load.)
func TestHotPrefixSpreadsWhenItsBackendSaturates(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	system := workload.Text(rng, 40_000) // about 10k tokens
	var w workload.Workload
	for i := range 48 {
		w.Sessions = append(w.Sessions, workload.Session{ID: fmt.Sprintf("s%d", i), System: system,
			Turns: []workload.Turn{{User: workload.Text(rng, 200), MaxTokens: 50}}})
	}
	w.Name = "hot-prefix"
	rep, err := Run(context.Background(), Config{Workload: w, Backends: 4, Profile: profile(t), Policies: []string{"kvroute"}, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	run := rep.Runs[0]
	per := map[string]int{}
	for _, r := range run.Requests {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		per[r.Backend]++
	}
	t.Logf("per backend %v, hit rate %.2f", per, run.Summary.HitRate)
	if len(per) < 2 {
		t.Fatalf("48 simultaneous requests with one hot prefix all went to %v", per)
	}
	for b, n := range per {
		if n > 36 {
			t.Errorf("%s took %d of 48: hot spot (%v)", b, n, per)
		}
	}
	if run.Summary.HitRate < 0.6 {
		t.Errorf("hit rate %.2f with one shared 10k-token prefix, want > 0.6 (%v)", run.Summary.HitRate, per)
	}
}

// The lazy merge of tiles yields the sessions in sessionOrder's order.
func TestOrderMatchesSort(t *testing.T) {
	w := chatWorkload(t, 50)
	slices.SortStableFunc(w.Sessions, func(a, b workload.Session) int { return cmpDuration(a.Start, b.Start) })
	// Equal starts across sessions, to exercise the ties.
	w.Sessions[3].Start = w.Sessions[2].Start
	for _, tile := range []int{1, 2, 7} {
		cfg := Config{Workload: w, Tile: tile}
		want := sessionOrder(cfg)
		o := newOrder(cfg)
		var got []sessionRef
		for o.left() {
			got = append(got, o.pop())
		}
		if !slices.Equal(got, want) {
			t.Errorf("tile %d: the merged order differs from the sorted one", tile)
		}
		if tile > 1 && o.list != nil {
			t.Errorf("tile %d: a sorted workload was listed whole", tile)
		}
	}
}

// Tiles share no prompt block, however many there are (a salt the
// block-id multiplication shifted out once made tiles 128 apart share all).
func TestTilesShareNothing(t *testing.T) {
	turn := &workload.Turn{Blocks: []uint64{1, 2, 3}, BlockTokens: 512, Tokens: 1536, MaxTokens: 16}
	seen := map[uint64]int32{}
	for tile := range int32(1000) {
		for _, h := range tokenHashes(nil, nil, turn, tile, 512) {
			if other, ok := seen[h]; ok {
				t.Fatalf("tiles %d and %d share block %#x", other, tile, h)
			}
			seen[h] = tile
		}
	}
}
