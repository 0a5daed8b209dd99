package kvroute

import (
	"math"
	"testing"
)

// A fleet whose known decode ratios spread beyond decodeMixedSpread is
// mixed: each known backend is priced at its ratio, one without enough
// streams at the fastest known; a narrower spread keeps the band of 1.
func TestDecodeMix(t *testing.T) {
	learn := func(paces []float64, streams int) *ratios {
		var r ratios
		r.init(len(paces), priorDecodeSlowness)
		for range streams {
			for i, pace := range paces {
				if pace > 0 {
					r.observe(i, pace*0.007, 0.007)
				}
			}
		}
		return &r
	}
	tests := []struct {
		name    string
		paces   []float64 // observed over predicted; 0: no streams
		streams int
		mixed   bool
		want    []float64 // price per backend
	}{
		{"one kind", []float64{0.9, 1.1, 1.0, 1.2}, 200, false, []float64{1, 1, 1, 1}},
		{"two generations", []float64{0.75, 0.75, 1.2, 1.2}, 200, true, []float64{0.75, 0.75, 1.2, 1.2}},
		{"a backend not yet seen", []float64{0.75, 1.2, 0}, 200, true, []float64{0.75, 1.2, 0.75}},
		{"too few streams", []float64{0.75, 1.2}, 20, false, []float64{1, 1}},
		// A thousand of one kind, paces spread evenly over 0.8–1.25 (their
		// learned ratios' extremes 1.5× apart, their 10th and 90th
		// percentiles 1.38×), and a thousand of two kinds, priced as
		// learned (the prior still pulls 0.7 to 0.727).
		{"a thousand of one kind", spread(1000, 0.8, 1.25), 200, false, []float64{1, 1}},
		{"a thousand of two kinds", append(spread(500, 0.7, 0.8), spread(500, 1.15, 1.25)...), 200, true, []float64{0.727, 0.727}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := learn(tt.paces, tt.streams)
			m := r.mix()
			if (m != nil) != tt.mixed {
				t.Fatalf("mixed = %v, want %v", m != nil, tt.mixed)
			}
			table := r.load()
			for i, want := range tt.want {
				if got := m.price(i, math.Float64frombits(table[i].Load())); math.Abs(got-want) > 0.02 {
					t.Errorf("backend %d priced at %.3f, want %.3f", i, got, want)
				}
			}
		})
	}
}

// spread returns n paces evenly from lo to hi.
func spread(n int, lo, hi float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = lo + (hi-lo)*float64(i)/float64(n-1)
	}
	return out
}
