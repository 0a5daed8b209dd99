package calibrate

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

var predictionSink Prediction

// BenchmarkPredict measures the hot path: one backend's prediction, as the
// router computes it for every candidate of every request.
func BenchmarkPredict(b *testing.B) {
	for _, dim := range []int{2, 4, 8} {
		m := mustNew(b, Config{Dim: dim})
		rng := rand.New(rand.NewPCG(1, 1))
		x := make([]float64, dim)
		for k := range 1000 {
			for j := range x {
				x[j] = rng.Float64()
			}
			x[0], x[1] = 1, 0.1+x[1]
			m.Observe(k%64, x, x[1]*noise(rng, 0.1))
		}
		b.Run(fmt.Sprintf("dim=%d", dim), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				predictionSink = m.Predict(i&63, x)
				i++
			}
		})
		b.Run(fmt.Sprintf("dim=%d/parallel", dim), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var p Prediction
				i := 0
				for pb.Next() {
					p = m.Predict(i&63, x)
					i++
				}
				predictionSink = p
			})
		})
	}
}

var observeSink float64

// BenchmarkObserve measures the learner's cost per outcome, under its
// mutex: two Cholesky solves and two histogram updates.
func BenchmarkObserve(b *testing.B) {
	for _, dim := range []int{2, 4, 8} {
		b.Run(fmt.Sprintf("dim=%d", dim), func(b *testing.B) {
			m := mustNew(b, Config{Dim: dim})
			rng := rand.New(rand.NewPCG(1, 1))
			x := make([]float64, dim)
			for j := range x {
				x[j] = rng.Float64()
			}
			x[0] = 1
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				m.Observe(i&63, x, 0.1+x[1])
				i++
			}
			observeSink = m.Predict(0, x).Mean
		})
	}
}
