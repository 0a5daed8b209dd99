package kvroute

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/routertest"
)

// A fleet whose engines report no cached tokens where the index predicts
// many (prefix caching off) raises the alarm within a minute of requests at
// two a second, and from then on the policy prices no affinity: a prompt
// the index holds is priced as computed whole, and the router counts its
// whole prefill.
func TestDeadCacheSignalStopsPricingAffinity(t *testing.T) {
	bs := routertest.Backends(4)
	now := time.Unix(1000, 0)
	r := newKVRouter(bs, Config{Seed: 1, Now: func() time.Time { return now }})
	p := r.Policy().(*Policy)
	system := routertest.Words(1, 16_000) // about 4k tokens every request shares
	var alarm time.Duration
	for i := range 240 {
		req := &router.Request{Model: "m", Prompt: system + routertest.Words(100+i, 200)}
		tk := routertest.Route(t, r, req, bs)
		if alarm == 0 && p.cal.cacheDead(tk.Backend.Index) {
			alarm = time.Duration(i) * 500 * time.Millisecond
			if tk.Cached != 0 {
				t.Errorf("after the alarm the decision still counts %d tokens cached", tk.Cached)
			}
		}
		tk.FirstToken()
		tk.Finish(router.Outcome{Status: 200, PromptTokens: req.PromptTokens, CachedTokens: 0,
			CompletionTokens: 10, Tokens: 10, TTFT: 50 * time.Millisecond, Latency: 200 * time.Millisecond})
		now = now.Add(500 * time.Millisecond)
	}
	if alarm == 0 || alarm > time.Minute {
		t.Fatalf("the alarm fired after %v of requests at 2/s, want within a minute", alarm)
	}
	t.Logf("alarm after %v", alarm)
	if got := cacheState(t, p, ""); got != "dead" {
		t.Errorf(`kvroute_cache_signal_state{backend=""} is %q, want "dead"`, got)
	}
	d := routertest.Pick(t, p, &router.Request{Model: "m", Prompt: system + "again", PromptTokens: 4000}, bs)
	for _, s := range d.Scores {
		if s.Cached != 0 {
			t.Errorf("%s is priced with %d tokens cached on a fleet whose cache signal is dead", s.Backend, s.Cached)
		}
	}
}

// cacheState returns the state the policy's kvroute_cache_signal_state
// reports for backend ("" for the fleet).
func cacheState(t *testing.T, p *Policy, backend string) string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(p)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["backend"] == backend && m.GetGauge().GetValue() == 1 {
				return labels["state"]
			}
		}
	}
	return ""
}

// On an engine three times slower than the model says, with a tenth of a
// second per request on top, the calibrated TTFT takes over the pricing
// and predicts within 15 % after a few hundred requests; on an engine the
// model describes, the model keeps it.
func TestCalibrationTakesOverWhereItPredictsBetter(t *testing.T) {
	for _, tt := range []struct {
		name           string
		truth          func(model float64) float64
		wantCalibrated bool
	}{
		{"the model's engine", func(m float64) float64 { return m }, false},
		{"a slower engine", func(m float64) float64 { return 3*m + 0.1 }, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bs := routertest.Backends(4)
			now := time.Unix(1000, 0)
			r := newKVRouter(bs, Config{Seed: 1, Now: func() time.Time { return now }})
			p := r.Policy().(*Policy)
			var apes []float64
			for i := range 500 {
				// Prompts of 100 to 20k tokens, some sharing a prefix.
				n := 400 + (i*7919)%80_000
				req := &router.Request{Model: "m", Prompt: routertest.Words(i%5, n/2) + routertest.Words(1000+i, n/2)}
				tk := routertest.Route(t, r, req, bs)
				model := modelTTFT(t, tk.Decision)
				y := tt.truth(model)
				if i >= 300 {
					apes = append(apes, math.Abs(tk.PredictedTTFT.Seconds()-y)/y)
				}
				tk.FirstToken()
				tk.Finish(router.Outcome{Status: 200, PromptTokens: req.PromptTokens, CachedTokens: tk.Cached,
					CompletionTokens: 10, Tokens: 10, TTFT: seconds(y), Latency: seconds(y + 0.1)})
				now = now.Add(time.Second) // one at a time: no queue
			}
			if got := p.cal.sel.calibrated.Load(); got != tt.wantCalibrated {
				t.Errorf("calibrated prices: %v, want %v", got, tt.wantCalibrated)
			}
			slices.Sort(apes)
			if med := apes[len(apes)/2]; med > 0.15 {
				t.Errorf("median error of the predicted TTFT over requests 300-500: %.3f, want at most 0.15", med)
			} else {
				t.Logf("median error over requests 300-500: %.3f", med)
			}
		})
	}
}

// modelTTFT returns the engine model's TTFT for the chosen backend: the
// terms of its score before the calibration's.
func modelTTFT(t *testing.T, d router.Decision) float64 {
	t.Helper()
	for _, s := range d.Scores {
		if s.Backend != d.Backend.Name {
			continue
		}
		var sum float64
		for i, name := range s.Terms.Names {
			if name == "calibration" {
				return sum
			}
			sum += s.Terms.Seconds[i]
		}
	}
	t.Fatal("no score for the chosen backend")
	return 0
}

// An engine whose speed halves mid-run (a restart on a slower GPU) is
// re-fitted: within 300 requests of the change the predicted TTFT is back
// within 15 % at the median.
func TestPredictionsRecoverWhenTheEngineSlows(t *testing.T) {
	bs := routertest.Backends(4)
	now := time.Unix(1000, 0)
	r := newKVRouter(bs, Config{Seed: 1, Now: func() time.Time { return now }})
	const change = 400
	var window []float64
	recovered := -1
	for i := range change + 600 {
		n := 400 + (i*7919)%80_000
		req := &router.Request{Model: "m", Prompt: routertest.Words(i%5, n/2) + routertest.Words(1000+i, n/2)}
		tk := routertest.Route(t, r, req, bs)
		// The engine: 20 ms and 10k tokens/s of prefill (the model's prior
		// is 30k), then twice as slow.
		rate := 10_000.0
		if i >= change {
			rate /= 2
		}
		y := 0.02 + float64(req.PromptTokens-tk.Cached)/rate
		if i >= change {
			window = append(window, math.Abs(tk.PredictedTTFT.Seconds()-y)/y)
			if len(window) > 50 {
				window = window[1:]
			}
			if recovered < 0 && len(window) == 50 && median(window) < 0.15 {
				recovered = i - change
			}
		}
		tk.FirstToken()
		tk.Finish(router.Outcome{Status: 200, PromptTokens: req.PromptTokens, CachedTokens: tk.Cached,
			CompletionTokens: 10, Tokens: 10, TTFT: seconds(y), Latency: seconds(y + 0.1)})
		now = now.Add(time.Second)
	}
	if recovered < 0 || recovered > 300 {
		t.Fatalf("the median error over 50 requests was back under 15 %% %d requests after the change, want within 300", recovered)
	}
	t.Logf("back under 15 %% %d requests after the engine slowed", recovered)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// A batch is taken as full when the engine runs the same most whenever
// requests wait with KV to spare (max_num_seqs), not when requests wait
// for prefill budget at whatever number running, nor for memory.
func TestBatchWatch(t *testing.T) {
	type scrape struct {
		running, waiting int
		kv               float64
	}
	for _, tt := range []struct {
		name     string
		scrapes  []scrape
		wantSeen int
		wantFull bool
	}{
		{"capped at 8", []scrape{{3, 0, 0.2}, {8, 2, 0.4}, {8, 1, 0.4}, {6, 0, 0.3}, {8, 3, 0.5}}, 8, true},
		{"waiting for budget", []scrape{{9, 1, 0.2}, {12, 0, 0.3}, {7, 1, 0.3}, {10, 2, 0.4}, {5, 1, 0.2}, {12, 1, 0.3}}, 12, false},
		{"waiting for memory", []scrape{{8, 2, 0.95}, {8, 3, 0.97}, {8, 1, 0.99}}, 8, false},
		{"too few scrapes", []scrape{{8, 2, 0.4}, {8, 1, 0.4}}, 8, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var c calibration
			c.batches.Store(newBatchWatches(nil, 1))
			b := routertest.Backends(1)[0]
			var seen int
			var full bool
			for i, sc := range tt.scrapes {
				m := &fleet.Metrics{Running: float64(sc.running), Waiting: float64(sc.waiting), KVUsage: sc.kv, At: time.Unix(int64(i), 0)}
				c.batchSeen(b, m) // a scrape read by several picks counts once
				seen, full = c.batchSeen(b, m)
			}
			if seen != tt.wantSeen || full != tt.wantFull {
				t.Errorf("seen %d, full %v; want %d, %v", seen, full, tt.wantSeen, tt.wantFull)
			}
		})
	}
}
