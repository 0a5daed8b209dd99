package calibrate

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestSummarize(t *testing.T) {
	tests := []struct {
		name    string
		samples []Sample
		want    Summary
	}{
		{"empty", nil, Summary{}},
		{"exact", []Sample{{1, 0.9, 1.1, 1}, {2, 1, 3, 2}}, Summary{N: 2, Coverage: 1}},
		{
			"odd count, one outside",
			[]Sample{{1.1, 1, 1.2, 1}, {0.8, 0.7, 0.9, 1}, {3, 2, 4, 2}},
			Summary{N: 3, MedianAPE: 0.2, MeanAPE: (0.1 + 0.2 + 0.5) / 3, Coverage: 2.0 / 3},
		},
		{
			"even count, invalid skipped",
			[]Sample{{1.1, 0, 2, 1}, {1.3, 0, 2, 1}, {0, 0, 2, 1}, {1, 0, 2, -1}},
			Summary{N: 2, MedianAPE: 0.2, MeanAPE: 0.2, Coverage: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Summarize(tt.samples)
			near := func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }
			if got.N != tt.want.N || !near(got.MedianAPE, tt.want.MedianAPE) || !near(got.MeanAPE, tt.want.MeanAPE) || !near(got.Coverage, tt.want.Coverage) {
				t.Errorf("Summarize = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestAccuracyMatchesSummarize: the online score agrees with the exact one
// over the same samples after the warm-up, within the histogram's
// resolution.
func TestAccuracyMatchesSummarize(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	a := NewAccuracy("ttft", 100)
	var all [2][]Sample
	for k := range 1100 {
		i := k % 2
		truth := 0.05 + rng.Float64()
		p := Prediction{Mean: truth, Lo: truth * 0.85, Hi: truth * 1.2}
		y := truth * noise(rng, 0.15*float64(i+1))
		a.Record(i, p, y)
		if k >= 100 {
			all[i] = append(all[i], Sample{p.Mean, p.Lo, p.Hi, y})
		}
	}
	s := a.Snapshot()
	for i, b := range s.Backends {
		want := Summarize(all[i])
		t.Logf("backend %d: online median APE %.4f coverage %.3f over %d; exact %.4f %.3f over %d",
			i, b.MedianAPE, b.Coverage, b.Scored, want.MedianAPE, want.Coverage, want.N)
		if b.Count != 550 || int(b.Scored) != want.N {
			t.Errorf("backend %d: count %d scored %d, want 550 and %d", i, b.Count, b.Scored, want.N)
		}
		if math.Abs(b.MedianAPE/want.MedianAPE-1) > 0.025 || math.Abs(b.Coverage-want.Coverage) > 1e-12 {
			t.Errorf("backend %d: online %.4f %.4f, exact %.4f %.4f", i, b.MedianAPE, b.Coverage, want.MedianAPE, want.Coverage)
		}
	}
	if s.Fleet.Count != 1100 || s.Fleet.Scored != 1000 {
		t.Errorf("fleet count %d scored %d, want 1100 and 1000", s.Fleet.Count, s.Fleet.Scored)
	}
	if n := s.Fleet.Ratio[len(RatioBuckets)-1]; n > s.Fleet.Count || n < s.Fleet.Count*99/100 {
		t.Errorf("%d of %d ratios at most %v", n, s.Fleet.Count, RatioBuckets[len(RatioBuckets)-1])
	}
}

// A prediction without an interval is scored for its error and left out of
// the coverage, which is NaN with none.
func TestAccuracyWithoutIntervals(t *testing.T) {
	a := NewAccuracy("itl", 1)
	for range 3 {
		a.Record(0, Prediction{Mean: 0.012}, 0.010)
	}
	s := a.Snapshot().Fleet
	if s.Scored != 2 || math.Abs(s.MedianAPE-0.2) > 0.2*0.025 || !math.IsNaN(s.Coverage) {
		t.Errorf("scored %d, median APE %v, coverage %v; want 2, 0.2 and NaN", s.Scored, s.MedianAPE, s.Coverage)
	}
	a.Record(0, Prediction{Mean: 0.012, Lo: 0.005, Hi: 0.015}, 0.010)
	if s := a.Snapshot().Fleet; s.Coverage != 1 {
		t.Errorf("coverage %v after one prediction with an interval that held, want 1", s.Coverage)
	}
}

func TestAccuracyCollector(t *testing.T) {
	a := NewAccuracy("itl", 1)
	a.SetName(0, "a")
	a.SetName(2, "c")
	a.Record(0, Prediction{Mean: 0.01, Lo: 0.008, Hi: 0.012}, 0.01)
	a.Record(0, Prediction{Mean: 0.01, Lo: 0.008, Hi: 0.012}, 0.011)
	a.Record(1, Prediction{Mean: 0.02, Lo: 0.01, Hi: 0.03}, 0.04)
	a.Record(2, Prediction{Mean: 0.02, Lo: 0.01, Hi: 0.03}, 0.02)
	a.Reset(2)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a, NewAccuracy("ttft", 0))
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	want := `
# HELP kvroute_prediction_coverage_ratio Share of observed latencies inside the predicted interval (80 % by default) since the warm-up, by backend; the series without a backend label is the fleet's.
# TYPE kvroute_prediction_coverage_ratio gauge
kvroute_prediction_coverage_ratio{backend="",kind="itl"} 0.6666666666666666
kvroute_prediction_coverage_ratio{backend="a",kind="itl"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvroute_prediction_coverage_ratio"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(a, "kvroute_prediction_ratio"); n != 2 {
		t.Errorf("%d ratio histograms, want the fleet's and backend a's", n)
	}
}
