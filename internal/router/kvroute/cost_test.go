package kvroute

import (
	"math"
	"testing"

	"github.com/kvroute/kvroute/internal/router"
)

func TestEventCached(t *testing.T) {
	tests := []struct {
		name                string
		k                   router.KVState
		sure, maybe         int
		wantSure, wantMaybe int
	}{
		{name: "unknown keeps the index", k: router.KVState{}, sure: 64, maybe: 128, wantSure: 64, wantMaybe: 128},
		{name: "exact replaces a guess too high", k: router.KVState{Tokens: 32, Known: true, Exact: true}, sure: 64, maybe: 128, wantSure: 32, wantMaybe: 32},
		{name: "exact replaces a guess too low", k: router.KVState{Tokens: 256, Known: true, Exact: true}, sure: 64, maybe: 128, wantSure: 256, wantMaybe: 256},
		{name: "exact beyond the estimated prompt", k: router.KVState{Tokens: 512, Known: true, Exact: true}, wantSure: 512, wantMaybe: 512},
		{name: "partial only raises", k: router.KVState{Tokens: 96, Known: true}, sure: 64, maybe: 128, wantSure: 96, wantMaybe: 128},
		{name: "partial below the index", k: router.KVState{Tokens: 16, Known: true}, sure: 64, maybe: 128, wantSure: 64, wantMaybe: 128},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, m := eventCached(tt.k, tt.sure, tt.maybe)
			if s != tt.wantSure || m != tt.wantMaybe {
				t.Fatalf("eventCached = %d, %d; want %d, %d", s, m, tt.wantSure, tt.wantMaybe)
			}
		})
	}
}

// Each of kvroute's cost terms, one at a time (cost.go).

func TestExpectedCached(t *testing.T) {
	for _, tt := range []struct {
		name        string
		sure, maybe int
		odds        float64
		want        int
	}{
		{"index only", 1000, 1000, 0.5, 1000},
		{"recent at even odds", 1000, 3000, 0.5, 2000},
		{"recent never held", 1000, 3000, 0, 1000},
		{"recent always held", 0, 3000, 1, 3000},
	} {
		if got := expectedCached(tt.sure, tt.maybe, tt.odds); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestDrainLeft(t *testing.T) {
	d := drain{work: 2, at: 10} // 2 s of prefill as of t = 10 s
	for _, tt := range []struct {
		name      string
		now, most float64
		want      float64
	}{
		{"just sent", 10, 5, 2},
		{"half done", 11, 5, 1},
		{"done", 13, 5, 0},
		{"less left than the router counts", 10, 0.5, 0.5},
	} {
		if got := d.left(tt.now, tt.most); got != tt.want {
			t.Errorf("%s: %v s left, want %v", tt.name, got, tt.want)
		}
	}
}

func TestMissPenalty(t *testing.T) {
	if got := missPenalty(1, 100, 10, 0); got != 1 {
		t.Errorf("no backlog: %v, want the base 1", got)
	}
	// 10 requests/s a backend, each backend 0.5 s behind: a recomputed
	// prefix delays 5 more requests.
	if got := missPenalty(1, 100, 10, 0.5); got != 6 {
		t.Errorf("fleet queued: %v, want 6", got)
	}
	if got := missPenalty(0, 100, 10, 0.5); got != 0 {
		t.Errorf("penalty off: %v", got)
	}
}

func TestKVWait(t *testing.T) {
	for _, tt := range []struct {
		name                          string
		holding, need, capacity, hold float64
		want                          float64
	}{
		{"room", 100_000, 10_000, 400_000, 5, 0},
		{"exactly full", 390_000, 10_000, 400_000, 5, 0},
		// 200k tokens over: half a cache drains in half a holding time.
		{"oversubscribed", 590_000, 10_000, 400_000, 5, 2.5},
	} {
		if got := kvWait(tt.holding, tt.need, tt.capacity, tt.hold); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: %v s, want %v", tt.name, got, tt.want)
		}
	}
}

func TestSlotWait(t *testing.T) {
	for _, tt := range []struct {
		name     string
		requests int64
		slots    int
		want     float64
	}{
		{"a slot free", 3, 4, 0},
		{"all taken", 4, 4, 0.25 * 8},
		{"two queued ahead", 6, 4, 0.75 * 8},
	} {
		if got := slotWait(tt.requests, tt.slots, 8); got != tt.want {
			t.Errorf("%s: %v s, want %v", tt.name, got, tt.want)
		}
	}
}

func TestLoadBound(t *testing.T) {
	// 39 in flight on 4 backends, this one the 40th: 2 × 10 + the slack.
	if got := loadBound(2, 39, 4); got != 20+loadSlack {
		t.Errorf("bound %v, want %v", got, 20+loadSlack)
	}
	if got := loadBound(2, 0, 4); got != 0.5+loadSlack {
		t.Errorf("idle fleet: bound %v", got)
	}
}

func TestTieWindow(t *testing.T) {
	// Nothing depends on the choice: only the floor and the prefill's noise.
	if got := tieWindow(1, 1, 0); got != 1+tieFloor {
		t.Errorf("window %v, want %v", got, 1+tieFloor)
	}
	// A second of cost depends on the choice: 10 % of it.
	if got := tieWindow(2, 1, 0); math.Abs(got-2.1) > 1e-12 {
		t.Errorf("window %v, want 2.1", got)
	}
	// A long prefill's own 5 % noise widens it.
	if got := tieWindow(10, 10, 4); math.Abs(got-10.2) > 1e-12 {
		t.Errorf("window %v, want 10.2", got)
	}
}

func TestSlowness(t *testing.T) {
	if got := slowness(2, 1); got != 2 {
		t.Errorf("twice the fleet's mean: %v", got)
	}
	if got := slowness(1.5, 1.5); got != 1 {
		t.Errorf("the fleet's mean itself: %v", got)
	}
}

func TestSoonestTies(t *testing.T) {
	cand := []candidate{
		{cost: 1.0, cached: 500, ttft: 0.50},
		{cost: 1.1, cached: 500, ttft: 0.26},
		{cost: 1.1, cached: 500, ttft: 0.30}, // within tieTTFT of the soonest
		{cost: 1.2, cached: 200, ttft: 0.01}, // holds less of the prompt
		{cost: 9.0, cached: 500, ttft: 0.01}, // not a tie
	}
	ties, by := soonestTies(cand, 2, 500)
	if ties != 2 || math.Abs(by-(0.26+tieTTFT)) > 1e-12 {
		t.Errorf("%d ties up to %v s, want 2 up to %v s", ties, by, 0.26+tieTTFT)
	}
}
