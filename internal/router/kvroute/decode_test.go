package kvroute

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// The decode half of kvroute's cost, one term at a time (decode.go).

func TestDecodeFitLearnsTheStep(t *testing.T) {
	// Streams on an engine whose step is 5 ms + 10 ms per 100k tokens of
	// KV, and whose prefill stops decode as long as it computes.
	truth := func(kv, stallPerToken float64) float64 { return 0.005 + kv/kvUnit*0.010 + stallPerToken }
	d := newDecodeFit()
	for i := range 2000 {
		kv := float64(i%17) * 20_000
		stall := float64(i%5) * 0.002
		d.observe(kv, float64(1+i%40), stall, truth(kv, stall))
	}
	for _, tt := range []struct {
		name      string
		got, want float64
	}{
		{"base", d.base, 0.005},
		{"per 100k tokens of KV", d.perKV, 0.010},
		{"stall", d.stall, 1},
	} {
		if math.Abs(tt.got-tt.want) > 0.1*tt.want {
			t.Errorf("%s: %.4g, want %.4g", tt.name, tt.got, tt.want)
		}
	}
}

func TestDecodePerToken(t *testing.T) {
	d := newDecodeFit()
	alone := d.perToken(0, 1, 0)
	if math.Abs(alone-priorStep) > 0.0002 {
		t.Errorf("a lone stream: %.2f ms a token, want the prior's %.2f", alone*1e3, priorStep*1e3)
	}
	// 390k tokens of KV: about 26 ms a step on an H100 (DESIGN §4).
	if full := d.perToken(390_000, 48, 0); full < 0.024 || full > 0.028 {
		t.Errorf("a full cache: %.1f ms a token, want about 26", full*1e3)
	}
	// A backend prefilling half the time gives its streams half the steps.
	if half := d.perToken(0, 1, 0.5); math.Abs(half-2*alone) > 1e-9 {
		t.Errorf("prefilling half the time: %.2f ms, want %.2f", half*1e3, 2*alone*1e3)
	}
	if most := d.perToken(0, 1, 5); most > alone/(1-maxShare)+1e-9 {
		t.Errorf("share above one: %.2f ms, want at most %.2f", most*1e3, alone/(1-maxShare)*1e3)
	}
}

func TestOthersDelay(t *testing.T) {
	for _, tt := range []struct {
		name                                            string
		w                                               delayWeights
		requests, recomputed, least, own, grow, overlap float64
		want                                            float64
	}{
		{"idle backend", all, 0, 0, 0, 2, 0.001, 300, 0},
		{"a prefill stalls every stream", all, 4, 4, 0.2, 0.5, 0, 300, 2},
		{"its KV slows their steps", all, 2, 2, 0, 0, 0.001, 300, 0.6},
		{"e2e: the needed prefill at a quarter", e2eDelay, 4, 4, 0.5, 0.5, 0.001, 300, 0.5},
		{"e2e: the recompute it adds at double", e2eDelay, 4, 4, 0.1, 0.5, 0, 300, 4 * (0.025 + 0.8)},
		{"e2e: the recompute by its own count", e2eDelay, 4, 6, 0.1, 0.5, 0, 300, 4*0.025 + 6*0.8},
		{"e2e: the growth left out", e2eDelay, 2, 2, 0, 0, 0.001, 300, 0},
	} {
		if got := tt.w.othersDelay(tt.requests, tt.recomputed, tt.least, tt.own, tt.grow, tt.overlap); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: %v s, want %v", tt.name, got, tt.want)
		}
	}
}

func TestRecomputed(t *testing.T) {
	// Ten streams of a typical 500 tokens' mean 1/tokens of 1/100: short.
	st := stalled(10, 500, 0.01)
	if got := recomputed(st, 10, 500, 0.01, 0); got != st {
		t.Errorf("no turns to come: %v, want stalled's %v", got, st)
	}
	if got := recomputed(st, 10, 500, 0.01, 3); math.Abs(got-50) > 1e-9 {
		t.Errorf("a session with turns to come: %v, want 50 (per token alone)", got)
	}
	if got := recomputed(10, 10, 500, 0, 3); got != 10 {
		t.Errorf("no streams of the router's own there: %v, want 10", got)
	}
}

func TestShareDecays(t *testing.T) {
	var s share
	s.add(0, 3) // 3 s of prefill sent at t = 0: 0.1 s a second over 30 s
	if got := s.now(0); math.Abs(got-3/decodeWindow) > 1e-12 {
		t.Errorf("at once: %v, want %v", got, 3/decodeWindow)
	}
	if got := s.now(decodeWindow); math.Abs(got-3/decodeWindow/math.E) > 1e-12 {
		t.Errorf("a window later: %v, want 1/e of it", got)
	}
	s.add(decodeWindow, 1)
	if s.routed != 4 {
		t.Errorf("routed %v, want 4", s.routed)
	}
}

// Under the goodput objective a request goes where it and the streams
// already there meet the objective, even when another backend is cheaper
// in latency; one that cannot meet it anywhere is priced by latency.
func TestSLOMisses(t *testing.T) {
	d := newDecodeFit()
	slo := SLO{TTFT: time.Second, TPOT: 20 * time.Millisecond}
	st := streamCost{on: true, wOwn: 1, wOthers: all, out: 100, need: 1000, overlap: 100, fit: &d, slo: &slo,
		shares: []float64{0.8, 0}, inverse: make([]float64, 2), tpot: make([]float64, 2), pushed: make([]float64, 2)}
	cand := []candidate{{own: 0.1, ttft: 0.2, decodeSlow: 1}, {own: 0.1, ttft: 0.5, decodeSlow: 1}}
	loads := []fleet.Load{{}, {Requests: 2, DecodeTokens: 10_000}}
	for i := range cand {
		cand[i].cost = cand[i].ttft + st.cost(i, &cand[i], loads[i])
	}
	best, floor := st.misses(cand, 0, 0)
	if best != 1 {
		t.Errorf("chose %d (costs %v, %v), want 1: 0 prefills 80 %% of the time, its streams miss 20 ms a token", best, cand[0].cost, cand[1].cost)
	}
	if floor != 0 {
		t.Errorf("floor %v: one candidate meets the objective, so no miss is unavoidable", floor)
	}

	// Neither meets the TTFT bound: that miss is priced nowhere.
	slo.TPOT = 0
	cand = []candidate{{own: 3, ttft: 3, decodeSlow: 1}, {own: 3, ttft: 4, decodeSlow: 1}}
	for i := range cand {
		cand[i].cost = cand[i].ttft
	}
	if best, _ := st.misses(cand, 0, 0); best != 0 || cand[0].cost != 3 {
		t.Errorf("chose %d at cost %v, want 0 at its latency, 3", best, cand[0].cost)
	}
}

func TestStalled(t *testing.T) {
	for _, tt := range []struct {
		name                string
		n, typical, inverse float64
		want                float64
	}{
		{"no streams", 0, 300, 0, 0},
		{"none of its own there: streams as they are", 3, 300, 0, 3},
		{"typical streams count one each", 4, 300, 1.0 / 300, 4},
		{"short streams count more", 2, 300, 1.0 / 30, 11},   // 2 × (1 + 10) / 2
		{"long streams count less", 2, 300, 1.0 / 3000, 1.1}, // 2 × (1 + 0.1) / 2
	} {
		if got := stalled(tt.n, tt.typical, tt.inverse); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestStreamWeights(t *testing.T) {
	for _, tt := range []struct {
		name      string
		least     float64
		wantOwn   float64
		wantOther delayWeights
	}{
		{"short prompt", 0.05, ownStreamLight, e2eDelay},
		{"half a second of prefill", 0.5, 0.5, e2eDelay},
		{"long prompt", 3, 1, e2eDelay},
	} {
		own, others := streamWeights(tt.least)
		if own != tt.wantOwn || others != tt.wantOther {
			t.Errorf("%s: own %v, others %v; want %v, %v", tt.name, own, others, tt.wantOwn, tt.wantOther)
		}
	}
}
