package results

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// within reports whether got is within the sketch's relative error of want
// (and a nanosecond, the durations' own rounding).
func within(got, want time.Duration) bool {
	return math.Abs(float64(got-want)) <= Accuracy*float64(want)+1
}

// Every quantile of a sketch is within Accuracy of the exact nearest-rank
// percentile, over latencies spanning microseconds to minutes, with zeros,
// and for a sketch merged from parts.
func TestSketchErrorBound(t *testing.T) {
	tests := []struct {
		name string
		gen  func(r *rand.Rand) time.Duration
	}{
		{"lognormal", func(r *rand.Rand) time.Duration {
			return time.Duration(math.Exp(r.NormFloat64()*2.5 + 19)) // ~180 ms, wide
		}},
		{"uniform", func(r *rand.Rand) time.Duration { return time.Duration(r.Int64N(int64(time.Minute))) }},
		{"with zeros", func(r *rand.Rand) time.Duration {
			if r.IntN(4) == 0 {
				return 0
			}
			return time.Duration(r.Int64N(1e6))
		}},
		{"few values", func(r *rand.Rand) time.Duration { return time.Duration(1+r.IntN(3)) * time.Second }},
	}
	qs := []float64{0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			var whole, a, b Sketch
			vals := make([]time.Duration, 200_000)
			for i := range vals {
				vals[i] = tt.gen(r)
				whole.Add(vals[i])
				if i%3 == 0 {
					a.Add(vals[i])
				} else {
					b.Add(vals[i])
				}
			}
			a.Merge(&b)
			if whole.Count() != len(vals) || a.Count() != len(vals) {
				t.Fatalf("counts %d and %d, want %d", whole.Count(), a.Count(), len(vals))
			}
			exact := slices.Clone(vals)
			for _, q := range qs {
				want := Percentile(exact, q)
				if got := whole.Quantile(q); !within(got, want) {
					t.Errorf("q=%v: %v, exact %v", q, got, want)
				}
				if got := a.Quantile(q); !within(got, want) {
					t.Errorf("merged, q=%v: %v, exact %v", q, got, want)
				}
			}
		})
	}
}

// A sketch's memory does not grow with its count: its buckets are bounded
// by the range of the values, not their number.
func TestSketchBuckets(t *testing.T) {
	var s Sketch
	r := rand.New(rand.NewPCG(3, 4))
	s.Add(1)
	for range 1_000_000 {
		s.Add(time.Duration(1 + r.Int64N(int64(time.Hour))))
	}
	// From 1 ns to an hour: ln(3.6e12)/ln(γ) ≈ 2,900 buckets.
	if n := len(s.counts); n > 3000 {
		t.Errorf("%d buckets for values up to an hour", n)
	}
	if q := s.Quantile(0); q > 2 {
		t.Errorf("minimum %v, want about 1 ns", q)
	}
}

// Latencies answers exactly up to ExactLimit values, then within the
// sketch's bound.
func TestLatencies(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var l Latencies
	var all []time.Duration
	for range ExactLimit {
		d := time.Duration(r.Int64N(int64(time.Second)))
		l.Add(d)
		all = append(all, d)
	}
	for _, q := range []float64{0.5, 0.99} {
		if got, want := l.Quantile(q), Percentile(slices.Clone(all), q); got != want {
			t.Errorf("exact, q=%v: %v, want %v", q, got, want)
		}
	}
	for range ExactLimit {
		d := time.Duration(r.Int64N(int64(time.Second)))
		l.Add(d)
		all = append(all, d)
	}
	if l.exact != nil {
		t.Fatal("still exact past the limit")
	}
	for _, q := range []float64{0.5, 0.99} {
		if got, want := l.Quantile(q), Percentile(all, q); !within(got, want) {
			t.Errorf("sketched, q=%v: %v, want %v", q, got, want)
		}
	}
}
