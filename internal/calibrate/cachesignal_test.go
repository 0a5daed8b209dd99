package calibrate

import (
	"math/rand/v2"
	"testing"
	"time"
)

// phase is a stretch of traffic: for its duration, requests every interval
// round-robin over the backends, each predicted a few thousand cached
// tokens, of which the engine reports cached(predicted).
type phase struct {
	duration time.Duration
	cached   func(rng *rand.Rand, predicted int) int
}

// event is a transition and when, from the scenario's start, it came.
type event struct {
	at time.Duration
	CacheTransition
}

// runScenario plays phases on a CacheSignal with an injected clock and
// returns every transition that Changed.
func runScenario(backends int, interval time.Duration, phases []phase) []event {
	start := time.Unix(1_700_000_000, 0)
	now := start
	c := NewCacheSignal(CacheSignalConfig{Now: func() time.Time { return now }})
	rng := rand.New(rand.NewPCG(31, 32))
	var out []event
	k := 0
	for _, p := range phases {
		for end := now.Add(p.duration); now.Before(end); now = now.Add(interval) {
			predicted := 1000 + rng.IntN(3000)
			b, f := c.Observe(k%backends, predicted, p.cached(rng, predicted))
			k++
			for _, tr := range []CacheTransition{b, f} {
				if tr.Changed() {
					out = append(out, event{now.Sub(start), tr})
				}
			}
		}
	}
	return out
}

var (
	cachedNone  = func(*rand.Rand, int) int { return 0 }
	cachedNever = func(*rand.Rand, int) int { return -1 }
	cachedMost  = func(rng *rand.Rand, p int) int {
		if rng.IntN(4) == 0 { // a quarter evicted
			return 0
		}
		return p * 9 / 10
	}
)

func TestCacheSignal(t *testing.T) {
	const second = time.Second
	type edge struct {
		to       CacheState
		from, by time.Duration // the edge must come in [from, by)
	}
	dead := edge{CacheDead, 0, 60 * second}
	tests := []struct {
		name     string
		backends int
		phases   []phase
		want     map[int][]edge // by backend (Fleet too); nothing else may change
	}{
		{
			"healthy: no alarm", 3,
			[]phase{{10 * time.Minute, cachedMost}},
			nil,
		},
		{
			"dead one backend, then recovers", 1,
			[]phase{{5 * time.Minute, cachedNone}, {5 * time.Minute, cachedMost}},
			map[int][]edge{
				0:     {dead, {CacheOK, 300 * second, 390 * second}},
				Fleet: {dead, {CacheOK, 300 * second, 390 * second}},
			},
		},
		{
			"dead fleet of three at 2 req/s, then recovers", 3,
			[]phase{{5 * time.Minute, cachedNone}, {5 * time.Minute, cachedMost}},
			map[int][]edge{
				0:     {dead, {CacheOK, 300 * second, 390 * second}},
				1:     {dead, {CacheOK, 300 * second, 390 * second}},
				2:     {dead, {CacheOK, 300 * second, 390 * second}},
				Fleet: {dead, {CacheOK, 300 * second, 390 * second}},
			},
		},
		{
			"unreported, then reported", 2,
			[]phase{{3 * time.Minute, cachedNever}, {3 * time.Minute, cachedMost}},
			map[int][]edge{
				0:     {{CacheUnreported, 0, 60 * second}, {CacheOK, 180 * second, 240 * second}},
				1:     {{CacheUnreported, 0, 60 * second}, {CacheOK, 180 * second, 240 * second}},
				Fleet: {{CacheUnreported, 0, 60 * second}, {CacheOK, 180 * second, 240 * second}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := map[int][]edge{}
			for _, e := range runScenario(tt.backends, 500*time.Millisecond, tt.phases) {
				t.Logf("at %v: backend %d %v → %v (ratio %.3f)", e.at, e.Backend, e.From, e.To, e.Ratio)
				got[e.Backend] = append(got[e.Backend], edge{e.To, e.at, e.at})
			}
			for b := range got {
				if _, ok := tt.want[b]; !ok {
					t.Errorf("backend %d changed %d times, want never", b, len(got[b]))
				}
			}
			for b, want := range tt.want {
				if len(got[b]) != len(want) {
					t.Errorf("backend %d changed %d times, want %d", b, len(got[b]), len(want))
					continue
				}
				for k, w := range want {
					if e := got[b][k]; e.to != w.to || e.from < w.from || e.from >= w.by {
						t.Errorf("backend %d: → %v at %v, want → %v in [%v, %v)", b, e.to, e.from, w.to, w.from, w.by)
					}
				}
			}
		})
	}
}

// TestCacheSignalReset: a backend that left stops counting in the fleet's
// verdict.
func TestCacheSignalReset(t *testing.T) {
	now := time.Unix(0, 0)
	c := NewCacheSignal(CacheSignalConfig{Now: func() time.Time { return now }})
	for range 100 {
		now = now.Add(time.Second)
		c.Observe(0, 2000, 0)
		c.Observe(1, 2000, 1800)
		c.Observe(2, 2000, 0)
	}
	if c.State(0) != CacheDead || c.State(1) != CacheOK || c.FleetState() != CacheDead {
		t.Fatalf("states %v %v fleet %v, want dead ok dead", c.State(0), c.State(1), c.FleetState())
	}
	if f := c.Reset(0); f.To != CacheOK || !f.Changed() {
		t.Errorf("after Reset(0) the fleet went %v → %v, want dead → ok (one dead of two)", f.From, f.To)
	}
	if c.State(0) != CacheOK || c.State(7) != CacheOK {
		t.Errorf("reset and unknown backends %v %v, want ok", c.State(0), c.State(7))
	}
}
