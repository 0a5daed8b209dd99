package calibrate

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestConverges: engines the prior does not know are learned within the
// warm-up, with honest 80 % intervals, and beat the prior by far.
func TestConverges(t *testing.T) {
	tests := []struct {
		name        string
		engine      engine
		features    func(request) []float64
		maxMAPE     float64
		minCov      float64
		maxCov      float64
		beatPriorBy float64 // calibrated MAPE × this ≤ the prior's
	}{
		{"linear", linear(1), linearFeatures, 0.15, 0.75, 0.85, 2},
		{"batch slowdown", batchSlowdown, batchFeatures, 0.15, 0.75, 0.85, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			m := mustNew(t, Config{Dim: len(tt.features(request{}))})
			play(m, 0, tt.engine, tt.features, rng, 0.1, 200)
			got, prior := play(m, 0, tt.engine, tt.features, rng, 0.1, 1000)
			s, ps := Summarize(got), Summarize(prior)
			t.Logf("after 200: median APE %.3f (prior alone %.3f), coverage %.3f over %d; θ = %.4f",
				s.MedianAPE, ps.MedianAPE, s.Coverage, s.N, m.Coefficients(0))
			if s.MedianAPE > tt.maxMAPE {
				t.Errorf("median APE %.3f, want ≤ %.2f", s.MedianAPE, tt.maxMAPE)
			}
			if s.Coverage < tt.minCov || s.Coverage > tt.maxCov {
				t.Errorf("coverage %.3f, want %.2f–%.2f", s.Coverage, tt.minCov, tt.maxCov)
			}
			if s.MedianAPE*tt.beatPriorBy > ps.MedianAPE {
				t.Errorf("median APE %.3f does not beat the prior's %.3f by %v×", s.MedianAPE, ps.MedianAPE, tt.beatPriorBy)
			}
		})
	}
}

// TestAdapts: an engine whose speed halves is re-fitted within 300
// observations, counted by the median APE of the last 50.
func TestAdapts(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	m := mustNew(t, Config{Dim: 4})
	play(m, 0, linear(1), linearFeatures, rng, 0.1, 500)
	after, _ := play(m, 0, linear(2), linearFeatures, rng, 0.1, 600)
	const window = 50
	back, peak, worstLate := -1, 0.0, 0.0
	for k := window; k <= len(after); k++ {
		e := Summarize(after[k-window : k]).MedianAPE
		peak = max(peak, e)
		if back < 0 && e < 0.15 {
			back = k
		}
		if k > 300 {
			worstLate = max(worstLate, e)
		}
	}
	t.Logf("speed halved: window-of-50 median APE peaked at %.3f, under 15 %% after %d observations, worst after 300 %.3f",
		peak, back, worstLate)
	if peak < 0.3 {
		t.Errorf("peak %.3f: the change should have shown", peak)
	}
	if back < 0 || back > 300 {
		t.Errorf("median APE under 15 %% after %d observations, want ≤ 300", back)
	}
	if worstLate >= 0.15 {
		t.Errorf("median APE back to %.3f after 300 observations", worstLate)
	}
}

// gridError returns the mean over a grid of requests of |a/b − 1|.
func gridError(a, b func(request) float64) float64 {
	sum, n := 0.0, 0
	for _, u := range []float64{0.1, 1, 5, 15} {
		for _, w := range []float64{0, 1, 3} {
			r := request{uncached: u, waiting: w}
			sum += math.Abs(a(r)/b(r) - 1)
			n++
		}
	}
	return sum / float64(n)
}

// TestShrinks: a backend with few observations predicts like the fleet,
// one with many like itself.
func TestShrinks(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	m := mustNew(t, Config{Dim: 4})
	for range 500 {
		play(m, 0, linear(1), linearFeatures, rng, 0.1, 1)
		play(m, 1, linear(2), linearFeatures, rng, 0.1, 1)
	}
	predict := func(i int) func(request) float64 {
		return func(r request) float64 { return m.Predict(i, linearFeatures(r)).Mean }
	}
	play(m, 2, linear(3), linearFeatures, rng, 0.1, 5)
	newToFleet, newToSelf := gridError(predict(2), predict(Fleet)), gridError(predict(2), linear(3))
	oldToSelf, oldToFleet := gridError(predict(1), linear(2)), gridError(predict(1), predict(Fleet))
	t.Logf("5 observations: %.3f from the fleet, %.3f from itself; 500: %.3f from itself, %.3f from the fleet",
		newToFleet, newToSelf, oldToSelf, oldToFleet)
	// Its five errors move its median correction a fifth of the way (they
	// weigh 5 beside the fleet's 20): nearer the fleet still.
	if newToFleet > 0.25 || newToFleet > newToSelf*0.7 {
		t.Errorf("a backend with 5 observations is %.3f from the fleet and %.3f from itself: want near the fleet", newToFleet, newToSelf)
	}
	// Relative least squares sits a few per cent below the mean under
	// 10 % noise (it is the median-like predictor MAPE rewards).
	if oldToSelf > 0.08 || oldToSelf > oldToFleet/2 {
		t.Errorf("a backend with 500 observations is %.3f from itself and %.3f from the fleet: want near itself", oldToSelf, oldToFleet)
	}
}

// TestPriorHolds: an engine the prior describes leaves the prior alone.
func TestPriorHolds(t *testing.T) {
	prior := func(r request) float64 { return r.builtin() }
	tests := []struct {
		name  string
		sigma float64
		tol   float64 // on predictions relative to the prior's
	}{
		{"exact", 0, 1e-9},
		{"noisy", 0.1, 0.05},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(9, 10))
			m := mustNew(t, Config{Dim: 5})
			features := func(r request) []float64 { return []float64{1, r.builtin(), r.uncached, r.running, r.waiting} }
			for range 1000 {
				play(m, rng.IntN(3), prior, features, rng, tt.sigma, 1)
			}
			worst := 0.0
			for _, i := range []int{Fleet, 0, 1, 2} {
				got := gridError(func(r request) float64 { return m.Predict(i, features(r)).Mean }, prior)
				worst = max(worst, got)
			}
			t.Logf("largest mean departure from the prior: %.2g; fleet θ = %.4f", worst, m.Coefficients(Fleet))
			if worst > tt.tol {
				t.Errorf("predictions depart from the prior by %.3g, want ≤ %v", worst, tt.tol)
			}
		})
	}
}

func TestNewRejects(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no features", Config{}},
		{"too many", Config{Dim: MaxDim + 1}},
		{"one without prior", Config{Dim: 1}},
		{"prior of the wrong size", Config{Dim: 3, Prior: []float64{0, 1}}},
		{"negative memory", Config{Dim: 2, Memory: -1}},
		{"quantiles reversed", Config{Dim: 2, Quantiles: [2]float64{0.9, 0.1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); err == nil {
				t.Error("New accepted it")
			}
		})
	}
}

// TestResetForgets: a reset backend predicts as the fleet again.
func TestResetForgets(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	m := mustNew(t, Config{Dim: 4})
	play(m, 0, linear(1), linearFeatures, rng, 0.1, 200)
	play(m, 1, linear(3), linearFeatures, rng, 0.1, 200)
	x := linearFeatures(request{uncached: 2, waiting: 1})
	if a, b := m.Predict(1, x), m.Predict(Fleet, x); a == b {
		t.Fatalf("backend 1 predicts as the fleet before Reset: %+v", a)
	}
	m.Reset(1)
	if a, b := m.Predict(1, x), m.Predict(Fleet, x); a != b {
		t.Errorf("after Reset backend 1 predicts %+v, the fleet %+v", a, b)
	}
}

func TestPredictAllocatesNothing(t *testing.T) {
	m := mustNew(t, Config{Dim: 8})
	rng := rand.New(rand.NewPCG(13, 14))
	x := make([]float64, 8)
	for i := range 3 {
		for range 50 {
			r := draw(rng)
			copy(x, []float64{1, r.builtin(), r.uncached, r.running, r.waiting, 0.5, r.uncached * r.running, 0.7})
			m.Observe(i, x, batchSlowdown(r))
		}
	}
	var sink Prediction
	allocs := testing.AllocsPerRun(1000, func() {
		var f [8]float64
		f[0], f[1] = 1, 0.1
		sink = m.Predict(1, f[:])
	})
	if allocs != 0 || sink.Mean <= 0 {
		t.Errorf("Predict allocated %v times (mean %v)", allocs, sink.Mean)
	}
}

// TestUnusedFeature: a feature that is always 0 (GPU utilisation where no
// exporter runs) keeps its prior coefficient and harms nothing.
func TestUnusedFeature(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	prior := []float64{0, 1, 0, 0, 0.25}
	m := mustNew(t, Config{Dim: 5, Prior: prior})
	features := func(r request) []float64 { return []float64{1, r.builtin(), r.uncached, r.waiting, 0} }
	play(m, 0, linear(1), features, rng, 0.1, 200)
	got, _ := play(m, 0, linear(1), features, rng, 0.1, 500)
	s := Summarize(got)
	for _, i := range []int{Fleet, 0} {
		if c := m.Coefficients(i)[4]; math.Abs(c-prior[4]) > 1e-9 {
			t.Errorf("backend %d: coefficient of the unused feature %v, want %v", i, c, prior[4])
		}
	}
	t.Logf("with an unused feature: median APE %.3f, coverage %.3f", s.MedianAPE, s.Coverage)
	if s.MedianAPE > 0.15 {
		t.Errorf("median APE %.3f, want ≤ 0.15", s.MedianAPE)
	}
}
