package router

import "math"

// speed is one backend's learned model of time to first token,
//
//	TTFT = overhead + work/rate + decoding × perDecode,
//
// where work is the prefill (tokens) the request waited for: its own
// uncached tokens plus what was queued ahead of it, and decoding the requests
// decoding there when it was routed (their tokens share every step with the
// prefill). It is an exponentially weighted least-squares fit, regularised
// towards the priors so that a few samples, or samples without spread in one
// feature, cannot make it absurd. Not safe for concurrent use.
type speed struct {
	n    float64       // decayed number of observations
	xx   [3][3]float64 // decayed Σ x xᵀ, x = (1, work/workUnit, decoding/decodeUnit)
	xt   [3]float64    // decayed Σ x · ttft
	fit  [3]float64    // θ: seconds, seconds per workUnit, seconds per decodeUnit
	rate float64       // tokens/s, from fit[1]
	// overhead and perDecode are fit[0] and fit[2]/decodeUnit, in seconds.
	overhead, perDecode float64
}

// Priors, used until observations say otherwise: an H100 running an 8B
// model prefills about 30k tokens/s, a step costs tens of milliseconds, and
// each decoding request adds a little to every step.
const (
	workUnit       = 1000.0 // tokens
	decodeUnit     = 10.0   // requests
	priorOverhead  = 0.02   // s
	priorRate      = 30_000.0
	priorPerDecode = 0.0005 // s per decoding request
	speedHalfLife  = 200.0  // observations
	ridge          = 1.0    // weight of the prior, in observations at unit features
)

var priorFit = [3]float64{priorOverhead, workUnit / priorRate, priorPerDecode * decodeUnit}

func newSpeed() speed {
	return speed{fit: priorFit, rate: priorRate, overhead: priorOverhead, perDecode: priorPerDecode}
}

// predict returns the TTFT in seconds after work tokens of prefill with
// decoding requests decoding alongside.
func (s *speed) predict(work, decoding float64) float64 {
	return s.overhead + work/s.rate + decoding*s.perDecode
}

func (s *speed) observe(work, decoding, ttft float64) {
	decay := 1 - 1/speedHalfLife
	x := [3]float64{1, work / workUnit, decoding / decodeUnit}
	s.n = s.n*decay + 1
	for i := range x {
		for j := range x {
			s.xx[i][j] = s.xx[i][j]*decay + x[i]*x[j]
		}
		s.xt[i] = s.xt[i]*decay + x[i]*ttft
	}
	// (Σ x xᵀ + ridge·I) θ = Σ x t + ridge·θ₀
	var a [3][4]float64
	for i := range 3 {
		for j := range 3 {
			a[i][j] = s.xx[i][j]
		}
		a[i][i] += ridge
		a[i][3] = s.xt[i] + ridge*priorFit[i]
	}
	fit, ok := solve3(a)
	if !ok {
		return
	}
	s.fit = fit
	s.overhead = clamp(fit[0], 0, 10)
	if fit[1] > 0 {
		s.rate = clamp(workUnit/fit[1], 100, 1e7)
	}
	s.perDecode = clamp(fit[2]/decodeUnit, 0, 1)
}

// solve3 solves a 3×3 linear system given as an augmented matrix, by
// Gaussian elimination with partial pivoting.
func solve3(a [3][4]float64) ([3]float64, bool) {
	for c := range 3 {
		p := c
		for r := c + 1; r < 3; r++ {
			if math.Abs(a[r][c]) > math.Abs(a[p][c]) {
				p = r
			}
		}
		if math.Abs(a[p][c]) < 1e-12 {
			return [3]float64{}, false
		}
		a[c], a[p] = a[p], a[c]
		for r := range 3 {
			if r == c {
				continue
			}
			f := a[r][c] / a[c][c]
			for k := c; k < 4; k++ {
				a[r][k] -= f * a[c][k]
			}
		}
	}
	return [3]float64{a[0][3] / a[0][0], a[1][3] / a[1][1], a[2][3] / a[2][2]}, true
}
