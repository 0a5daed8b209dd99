package calibrate

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
)

// MaxDim is the most features a Model takes: the hot path copies no
// slices, so the coefficients live in fixed arrays of this size.
const MaxDim = 8

// Fleet, as a backend index, means the fleet's shared fit: Predict(Fleet, x)
// predicts as for a backend never observed, and a CacheTransition whose
// Backend is Fleet is the fleet-wide verdict.
const Fleet = -1

// Defaults for Config, each explained in the package comment.
const (
	DefaultMemory = 100.0 // observations
	DefaultRidge  = 2.0   // observations
	DefaultShrink = 20.0  // observations
	DefaultFloor  = 0.001 // seconds
)

// DefaultQuantiles bound the 80 % prediction interval.
var DefaultQuantiles = [2]float64{0.1, 0.9}

// ErrConfig is wrapped by the errors of New for a configuration it cannot
// use.
var ErrConfig = errors.New("calibrate: invalid config")

// Config configures a Model. Zero fields take their defaults.
type Config struct {
	// Dim is the number of features, 1 to MaxDim; required.
	Dim int
	// Prior is θ₀, the coefficients before any observation and toward
	// which the fleet's fit is regularised. Default (0, 1, 0, …): trust
	// the built-in engine model passed as feature 1. Required when Dim is
	// 1.
	Prior []float64
	// Memory is the effective number of observations remembered, each
	// fit's and each histogram's: λ = 1 − 1/Memory. Default 100.
	Memory float64
	// Ridge is the weight of Prior on the fleet's fit, in observations.
	// Default 2.
	Ridge float64
	// Shrink is the weight of the fleet's fit on each backend's, and of
	// the fleet's log ratios in each backend's interval, in observations,
	// until the backend has seen Memory observations; it fades after
	// that (Model.shrink). Default 20.
	Shrink float64
	// Floor is the least latency predicted, in seconds: a fit may
	// extrapolate below zero, an engine cannot. Default 1 ms.
	Floor float64
	// Quantiles bound the prediction interval. Default {0.1, 0.9}.
	Quantiles [2]float64
}

// Prediction is a predicted latency and its interval, in seconds.
type Prediction struct {
	Mean   float64 // the point prediction, never below Config.Floor
	Lo, Hi float64 // the Config.Quantiles of the latency
}

// params is one immutable snapshot of a backend's (or the fleet's) fit,
// published for Predict.
type params struct {
	theta  [MaxDim]float64
	lo, hi float64 // interval factors, e^q
	mid    float64 // the median factor, e^q50: the fit's recent bias
}

// backend is one fit's state. All but snap are guarded by Model.mu.
type backend struct {
	fit    fit
	ratios logRatios
	theta  [MaxDim]float64
	seen   float64                // observations since New or Reset, undecayed
	snap   atomic.Pointer[params] // nil: never observed, predict as the fleet
}

// Model is an online calibrated latency predictor, per backend, shrunk
// toward the fleet (see the package comment for its form). Backends are
// identified by a dense index from 0, which may grow.
//
// All methods are safe for concurrent use. Observe, Grow, Reset and
// Coefficients take a mutex; Predict takes none, allocates nothing and
// costs a dot product: it reads an immutable snapshot that Observe
// replaces.
type Model struct {
	cfg      Config
	decay    float64
	mu       sync.Mutex
	fleet    backend
	backends atomic.Pointer[[]*backend] // replaced, pointers copied, on growth
}

// New returns a Model predicting with cfg.Prior until it observes, or an
// error wrapping ErrConfig.
func New(cfg Config) (*Model, error) {
	if err := cfg.normalise(); err != nil {
		return nil, err
	}
	m := &Model{cfg: cfg, decay: 1 - 1/cfg.Memory}
	copy(m.fleet.theta[:], cfg.Prior)
	m.fleet.ratios.seed(priorSpread)
	m.publish(&m.fleet, nil, 0)
	m.backends.Store(&[]*backend{})
	return m, nil
}

func (c *Config) normalise() error {
	if c.Dim < 1 || c.Dim > MaxDim {
		return fmt.Errorf("%w: Dim %d outside 1..%d", ErrConfig, c.Dim, MaxDim)
	}
	switch {
	case c.Prior == nil && c.Dim == 1:
		return fmt.Errorf("%w: Prior required with one feature", ErrConfig)
	case c.Prior == nil:
		c.Prior = make([]float64, c.Dim)
		c.Prior[1] = 1
	case len(c.Prior) != c.Dim:
		return fmt.Errorf("%w: Prior has %d coefficients, Dim is %d", ErrConfig, len(c.Prior), c.Dim)
	}
	c.Prior = append([]float64(nil), c.Prior...)
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Memory, DefaultMemory)
	def(&c.Ridge, DefaultRidge)
	def(&c.Shrink, DefaultShrink)
	def(&c.Floor, DefaultFloor)
	if c.Quantiles == [2]float64{} {
		c.Quantiles = DefaultQuantiles
	}
	q := c.Quantiles
	switch {
	case !(c.Memory > 1):
		return fmt.Errorf("%w: Memory %v must exceed 1 observation", ErrConfig, c.Memory)
	case !(c.Ridge > 0) || !(c.Shrink > 0) || !(c.Floor > 0):
		return fmt.Errorf("%w: Ridge, Shrink and Floor must be positive", ErrConfig)
	case !(0 <= q[0] && q[0] < q[1] && q[1] <= 1):
		return fmt.Errorf("%w: Quantiles %v must satisfy 0 ≤ lo < hi ≤ 1", ErrConfig, q)
	}
	return nil
}

// Dim returns the number of features the Model takes.
func (m *Model) Dim() int { return m.cfg.Dim }

// Predict returns the latency predicted for features x on backend i, in
// seconds. A backend never observed (or Reset, or out of range, or Fleet)
// predicts as the fleet. It panics unless len(x) is Dim. Lock-free and
// allocation-free; safe for concurrent use with every other method.
func (m *Model) Predict(i int, x []float64) Prediction {
	if len(x) != m.cfg.Dim {
		panic("calibrate: Predict with the wrong number of features")
	}
	p := m.fleet.snap.Load()
	if bs := *m.backends.Load(); uint(i) < uint(len(bs)) {
		if q := bs[i].snap.Load(); q != nil {
			p = q
		}
	}
	y := max(dot(&p.theta, x), m.cfg.Floor)
	// The fit minimises relative error, which leans low where latencies
	// have long tails; its recent median error corrects it, so that the
	// prediction is as often above the latency as below.
	mean := y * p.mid
	return Prediction{Mean: mean, Lo: min(y*p.lo, mean), Hi: max(y*p.hi, mean)}
}

// Observe teaches backend i's fit and the fleet's that features x came
// with latency y seconds, growing the index space to hold i. Observations
// with y or an x not finite, or y ≤ 0, are ignored: a failed request has no
// latency to learn. It panics unless len(x) is Dim or if i < 0. Safe for
// concurrent use; it takes the Model's mutex for a few microseconds.
func (m *Model) Observe(i int, x []float64, y float64) {
	if len(x) != m.cfg.Dim || i < 0 {
		panic("calibrate: Observe with the wrong number of features or a negative backend")
	}
	if !(y > 0) || math.IsInf(y, 0) {
		return
	}
	for _, v := range x {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.grow(i + 1)[i]
	// Weigh the observation by its own latency (relative error: doc.go)
	// and score it by what each fit predicted before it, so that the
	// interval includes the fit's own error.
	d, f := m.cfg.Dim, &m.fleet
	yf := max(dot(&f.theta, x), m.cfg.Floor)
	w := 1 / (y * y)
	f.fit.add(x, y, w, m.decay)
	f.ratios.add(math.Log(y/yf), m.decay)
	yb := yf
	if b.fit.n > 0 {
		yb = max(dot(&b.theta, x), m.cfg.Floor)
	} else {
		// Start from the fleet's fit rather than zero: a solve that fails
		// (it should not) then leaves the fleet's coefficients.
		b.theta = f.theta
	}
	b.fit.add(x, y, w, m.decay)
	b.ratios.add(math.Log(y/yb), m.decay)
	f.fit.solve(d, m.cfg.Ridge, m.cfg.Prior, f.theta[:d], &f.fit)
	m.publish(f, nil, 0)
	b.seen++
	shrink := m.shrink(b.seen)
	b.fit.solve(d, shrink, f.theta[:d], b.theta[:d], &f.fit)
	m.publish(b, &f.ratios, shrink)
}

// shrink returns the weight of the fleet's fit on a backend's that has
// seen n observations: Shrink while its fit remembers all it has seen,
// then fading as Shrink × Memory/n, down to Ridge. Forgetting is for
// following a changed engine, not evidence that the backend is like the
// fleet: one that has differed from the fleet for a thousand requests
// differs, and a constant pull toward the fleet would bias it by
// Shrink/(Memory + Shrink) of the difference for good (8 % on a backend
// twice as slow as the fleet, with the defaults).
func (m *Model) shrink(n float64) float64 {
	return max(m.cfg.Shrink*min(1, m.cfg.Memory/n), m.cfg.Ridge)
}

// dot returns θ·x; len(x) ≤ MaxDim.
func dot(theta *[MaxDim]float64, x []float64) float64 {
	t := theta[:len(x)]
	y := 0.0
	for j, v := range x {
		y += t[j] * v
	}
	return y
}

// publish makes b's coefficients and interval the snapshot Predict reads,
// its log ratios pooled with pool's, which weigh as many observations as
// weight. Call with mu held.
func (m *Model) publish(b *backend, pool *logRatios, weight float64) {
	p := &params{theta: b.theta}
	p.lo, p.hi = interval(&b.ratios, pool, weight, m.cfg.Quantiles)
	p.mid, _ = interval(&b.ratios, pool, weight, [2]float64{0.5, 0.5})
	b.snap.Store(p)
}

// Grow makes room for backends 0 to n−1; Observe grows on its own, so this
// only saves it the copy. Safe for concurrent use.
func (m *Model) Grow(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.grow(n)
}

// grow returns the backends, at least n of them. Call with mu held.
func (m *Model) grow(n int) []*backend {
	bs := *m.backends.Load()
	if n <= len(bs) {
		return bs
	}
	grown := make([]*backend, n, max(n, 2*len(bs)))
	copy(grown, bs)
	for i := len(bs); i < n; i++ {
		grown[i] = &backend{}
	}
	m.backends.Store(&grown)
	return grown
}

// Reset forgets what backend i taught its own fit, for a backend that left
// or restarted: it predicts as the fleet until it is observed again. What
// it taught the fleet stays. Safe for concurrent use.
func (m *Model) Reset(i int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if bs := *m.backends.Load(); uint(i) < uint(len(bs)) {
		b := bs[i]
		b.fit, b.ratios, b.theta, b.seen = fit{}, logRatios{}, [MaxDim]float64{}, 0
		b.snap.Store(nil)
	}
}

// Coefficients returns the coefficients backend i predicts with (the
// fleet's for Fleet or a backend never observed), for reports and tests.
// Safe for concurrent use.
func (m *Model) Coefficients(i int) []float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.fleet.snap.Load()
	if bs := *m.backends.Load(); uint(i) < uint(len(bs)) && bs[i].snap.Load() != nil {
		p = bs[i].snap.Load()
	}
	return append([]float64(nil), p.theta[:m.cfg.Dim]...)
}
