package kvroute

import (
	"math"
	"sync/atomic"
)

// ratios is every backend's latency relative to a fit pooled over the
// fleet: decayed sums of what was observed there and of what the pooled fit
// predicted for it, their quotient published for picks to read without the
// learner's lock, and the mean quotient over the backends in the fleet. A
// backend starts as if prior seconds had been observed exactly as
// predicted; both sums decay by slownessDecay per observation. Call the
// methods other than load with the learner's mu held.
type ratios struct {
	observed, predicted []float64
	live                []bool
	sum                 float64 // of the live backends' quotients
	n                   int     // live backends
	prior               float64
	table               atomic.Pointer[[]atomic.Uint64] // replaced, values copied, when the fleet grows
}

// init starts n backends, all in the fleet, at the prior.
func (r *ratios) init(n int, prior float64) {
	r.prior = prior
	r.observed, r.predicted, r.live = make([]float64, n), make([]float64, n), make([]bool, n)
	table := make([]atomic.Uint64, n)
	for i := range n {
		r.observed[i], r.predicted[i], r.live[i] = prior, prior, true
		table[i].Store(math.Float64bits(1))
	}
	r.sum, r.n = float64(n), n
	r.table.Store(&table)
}

// grow makes room for n backends; the new ones are not in the fleet.
func (r *ratios) grow(n int) {
	if n <= len(r.observed) {
		return
	}
	old := *r.table.Load()
	table := make([]atomic.Uint64, n)
	for i := range old {
		table[i].Store(old[i].Load())
	}
	for i := len(r.observed); i < n; i++ {
		r.observed = append(r.observed, r.prior)
		r.predicted = append(r.predicted, r.prior)
		r.live = append(r.live, false)
		table[i].Store(math.Float64bits(1))
	}
	r.table.Store(&table)
}

// set restarts backend i at the prior, in the fleet or out of it.
func (r *ratios) set(i int, live bool) {
	if r.live[i] {
		r.sum -= r.observed[i] / r.predicted[i]
		r.n--
	}
	r.observed[i], r.predicted[i] = r.prior, r.prior
	(*r.table.Load())[i].Store(math.Float64bits(1))
	if live {
		r.sum++
		r.n++
	}
	r.live[i] = live
}

// observe adds one latency observed on backend i and what the pooled fit
// predicted for it; a backend out of the fleet learns nothing.
func (r *ratios) observe(i int, observed, predicted float64) {
	if i >= len(r.live) || !r.live[i] {
		return
	}
	r.sum -= r.observed[i] / r.predicted[i]
	r.observed[i] = r.observed[i]*slownessDecay + observed
	r.predicted[i] = r.predicted[i]*slownessDecay + predicted
	q := r.observed[i] / r.predicted[i]
	r.sum += q
	(*r.table.Load())[i].Store(math.Float64bits(q))
}

// mean returns the mean quotient over the backends in the fleet.
func (r *ratios) mean() float64 { return r.sum / float64(max(r.n, 1)) }

// load returns every backend's quotient (float64 bits), by backend index;
// read once per pick. Safe for concurrent use.
func (r *ratios) load() []atomic.Uint64 { return *r.table.Load() }
