package calibrate

import (
	"math/rand/v2"
	"sync"
	"testing"
)

// TestConcurrent runs Observe, Predict, Grow and Reset together; under the
// race detector it fails on any unsynchronised access, and without it on a
// prediction that is not a finite positive interval around its mean.
func TestConcurrent(t *testing.T) {
	m := mustNew(t, Config{Dim: 5})
	const n = 2000
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for k := range n {
				r := draw(rng)
				m.Observe((k+g)%6, batchFeatures(r), batchSlowdown(r)*noise(rng, 0.1))
			}
		})
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			for k := range n {
				p := m.Predict(k%8, batchFeatures(draw(rng)))
				if !(0 < p.Lo && p.Lo <= p.Mean && p.Mean <= p.Hi) {
					t.Errorf("prediction %+v", p)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for k := range n / 10 {
			m.Grow(8 + k/20)
			m.Reset(k % 6)
		}
	})
	wg.Wait()
}
