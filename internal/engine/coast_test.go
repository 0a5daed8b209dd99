package engine

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// eventReplay plays a random workload through an engine the way the fleet
// simulator drives it: requests arrive at their own times while a step is
// in flight and join the step after it; the engine's counters are read at
// random moments. With coasting it takes runs of decode steps with Coast,
// settling them before each read and cutting them before each arrival;
// without, it calls Step for every step. It returns every request's
// outcome and every read, in order, as text.
func eventReplay(t *testing.T, coasting bool, seed uint64, blockSize, maxOutput int) (lines []string, coasts int) {
	t.Helper()
	p := testProfile(t, 3000*16/blockSize, 2048, 64)
	p.BlockSize = blockSize
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	var out []string
	var reqs []*Request
	busy, end := false, time.Duration(0) // the step or run in flight
	maxRun := 1 + int(seed%50)
	// advance takes every step that starts before until.
	advance := func(until time.Duration) {
		for busy && end <= until {
			now := end
			if coasting {
				e.Settle(now)
				if next := e.Coast(now, maxRun); next > now {
					end = next
					coasts++
					continue
				}
			}
			res := e.Step(now)
			busy, end = res.End > res.Start, res.End
		}
	}
	now := time.Duration(0)
	for i := range 1500 {
		// Bursts that fill the cache (evictions, preemptions) between calm
		// stretches (long runs of decodes).
		gap := 200 * time.Millisecond
		if i%300 < 150 {
			gap = 20 * time.Millisecond
		}
		now += time.Duration(rng.ExpFloat64() * float64(gap))
		advance(now)
		if rng.IntN(4) == 0 {
			// A scrape of the metrics at now.
			if coasting {
				e.Settle(now)
			}
			st := e.Stats()
			out = append(out, fmt.Sprintf("read at %v: %+v", now, st))
		}
		group := uint64(rng.IntN(20))
		var ids []uint64
		for k := range rng.IntN(40) {
			ids = append(ids, group<<20|uint64(k))
		}
		for range 1 + rng.IntN(20) {
			ids = append(ids, rng.Uint64())
		}
		tokens := len(ids)*64 - rng.IntN(64)
		r := &Request{ID: uint64(i), PromptLen: tokens, MaxTokens: 1 + rng.IntN(maxOutput), BlockHashes: HashBlockIDs(nil, ids, 64, tokens, blockSize)}
		if coasting {
			if cut, ok := e.Cut(now); ok {
				end = cut
			}
		}
		if err := e.Add(now, r); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
		if !busy {
			busy, end = true, now
		}
	}
	advance(time.Duration(1 << 62))
	for _, r := range reqs {
		out = append(out, fmt.Sprintf("request %d: arrival %v first %v last %v finish %v cached %d output %d preempted %d %v",
			r.ID, r.Arrival, r.FirstToken, r.LastToken, r.Finish, r.CachedTokens, r.Output, r.Preemptions, r.State))
	}
	out = append(out, fmt.Sprintf("final: %+v", e.Stats()))
	return out, coasts
}

// Coasting through runs of decode steps changes nothing anyone can see:
// every request's timings and every read of the counters are those of
// stepping one step at a time, with evictions and preemptions, whatever
// the longest run.
func TestCoastIdentical(t *testing.T) {
	for _, tc := range []struct {
		seed                 uint64
		blockSize, maxOutput int
	}{
		{1, 16, 300}, {2, 16, 300}, {23, 16, 300}, {3, 64, 300}, {49, 512, 300},
		// Outputs that grow into a full cache: runs must stop short of
		// the step that preempts.
		{4, 16, 8000}, {5, 64, 8000},
	} {
		t.Run(fmt.Sprintf("seed %d, blocks of %d, outputs up to %d", tc.seed, tc.blockSize, tc.maxOutput), func(t *testing.T) {
			want, _ := eventReplay(t, false, tc.seed, tc.blockSize, tc.maxOutput)
			got, coasts := eventReplay(t, true, tc.seed, tc.blockSize, tc.maxOutput)
			if coasts < 100 {
				t.Errorf("%d runs coasted: the test does not test coasting", coasts)
			}
			if len(got) != len(want) {
				t.Fatalf("%d lines, want %d", len(got), len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("line %d:\n got %s\nwant %s", i, got[i], want[i])
				}
			}
			if testing.Verbose() {
				t.Logf("%d runs coasted; %s", coasts, want[len(want)-1])
			}
		})
	}
}

// Coasting takes most steps in runs, or it would save nothing.
func TestCoastTakesRuns(t *testing.T) {
	p := testProfile(t, 10_000, 2048, 64)
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		mustAdd(t, e, 0, newReq(uint64(i), p.BlockSize, seq(i*10_000, 100), 200))
	}
	now, events := time.Duration(0), 0
	for e.HasWork() {
		events++
		e.Settle(now)
		if next := e.Coast(now, 1<<30); next > now {
			now = next
			continue
		}
		now = e.Step(now).End
	}
	st := e.Stats()
	if st.Finished != 4 || st.Steps != 200 {
		t.Fatalf("%d finished in %d steps, want 4 in 200", st.Finished, st.Steps)
	}
	// The prefill with the first token, one run of 198 decodes, the last.
	if events != 3 {
		t.Errorf("%d events for 200 steps, want 3", events)
	}
}

// Decoding requests that outgrow the cache with nothing waiting: a run must
// end before the step that has to preempt, and that step is Step's.
func TestCoastStopsBeforePreemption(t *testing.T) {
	p := testProfile(t, 100, 2048, 64) // 1,600 tokens
	outcome := func(coasting bool) (string, int) {
		e, err := New(p)
		if err != nil {
			t.Fatal(err)
		}
		var reqs []*Request
		for i := range 2 {
			r := newReq(uint64(i), p.BlockSize, seq(i*10_000, 100), 1000)
			mustAdd(t, e, 0, r)
			reqs = append(reqs, r)
		}
		now, coasts := time.Duration(0), 0
		for e.HasWork() {
			e.Settle(now)
			if coasting {
				if next := e.Coast(now, 1<<30); next > now {
					now = next
					coasts++
					continue
				}
			}
			now = e.Step(now).End
		}
		out := fmt.Sprintf("%+v", e.Stats())
		for _, r := range reqs {
			out += fmt.Sprintf("\n%d: first %v finish %v preempted %d", r.ID, r.FirstToken, r.Finish, r.Preemptions)
		}
		return out, coasts
	}
	want, _ := outcome(false)
	got, coasts := outcome(true)
	if got != want {
		t.Errorf("coasting:\n%s\nstepping:\n%s", got, want)
	}
	t.Logf("%d runs; %s", coasts, want)
	if !strings.Contains(want, "Preemptions:1") || coasts < 2 {
		t.Errorf("the test needs one preemption and runs around it: %d runs; %s", coasts, want)
	}
}
