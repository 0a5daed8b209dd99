package kvroute

import (
	"math"
)

// speed is a learned model of time to first token on an idle backend,
//
//	TTFT = overhead + m/rate + m·(c + m/2)/attn + decoding × perDecode,
//
// for a request with m tokens to compute after c cached ones, while
// decoding other requests decode alongside (their tokens share every step
// with the prefill). The second term is the linear layers, the third
// attention: every computed token attends to all before it, so a prompt's
// prefill grows with its square (for an 8B model the two are equal at about
// 30k tokens of context). It is an exponentially weighted least-squares fit,
// regularised towards the priors so that a few samples, or samples without
// spread in one feature, cannot make it absurd. Not safe for concurrent use.
type speed struct {
	n   float64                       // decayed number of observations
	xx  [speedDims][speedDims]float64 // decayed Σ x xᵀ
	xt  [speedDims]float64            // decayed Σ x · ttft
	fit [speedDims]float64            // θ, in seconds per unit of each feature
	// rate (tokens/s), attn (tokens²/s), overhead and perDecode (s) are
	// read off the fit; perToken and perAttend are 1/rate and 1/attn, for
	// prefill, which a decision at a thousand backends calls thousands of
	// times.
	rate, attn, overhead, perDecode float64
	perToken, perAttend             float64
}

// The features, x = (1, m/workUnit, m(c+m/2)/attnUnit, decoding/decodeUnit),
// are scaled to be of order one.
const (
	speedDims  = 4
	workUnit   = 1000.0 // tokens
	attnUnit   = 1e8    // tokens²
	decodeUnit = 10.0   // requests
)

// Priors, used until observations say otherwise: an H100 running an 8B
// model prefills about 30k tokens/s, attention matches the linear layers'
// cost at 30k tokens of context, a step costs tens of milliseconds, and
// each decoding request adds a little to every step.
const (
	priorOverhead  = 0.02 // s
	priorRate      = 30_000.0
	priorAttn      = priorRate * 30_000
	priorPerDecode = 0.0005 // s per decoding request
	speedHalfLife  = 200.0  // observations
	ridge          = 1.0    // weight of the prior, in observations at unit features
)

var priorFit = [speedDims]float64{priorOverhead, workUnit / priorRate, attnUnit / priorAttn, priorPerDecode * decodeUnit}

func newSpeed() speed {
	s := speed{fit: priorFit}
	s.read()
	return s
}

func speedFeatures(m, c, decoding float64) [speedDims]float64 {
	return [speedDims]float64{1, m / workUnit, m * (c + m/2) / attnUnit, decoding / decodeUnit}
}

// prefill returns the seconds of computing m tokens after c cached ones.
func (s *speed) prefill(m, c float64) float64 {
	return m*s.perToken + m*(c+m/2)*s.perAttend
}

// predict returns the TTFT in seconds of m tokens to compute after c cached
// ones with decoding requests decoding alongside, on an idle backend.
func (s *speed) predict(m, c, decoding float64) float64 {
	return s.overhead + s.prefill(m, c) + decoding*s.perDecode
}

func (s *speed) observe(m, c, decoding, ttft float64) {
	decay := 1 - 1/speedHalfLife
	x := speedFeatures(m, c, decoding)
	s.n = s.n*decay + 1
	for i := range x {
		for j := range x {
			s.xx[i][j] = s.xx[i][j]*decay + x[i]*x[j]
		}
		s.xt[i] = s.xt[i]*decay + x[i]*ttft
	}
	// (Σ x xᵀ + ridge·I) θ = Σ x t + ridge·θ₀
	var a [speedDims][speedDims + 1]float64
	for i := range speedDims {
		for j := range speedDims {
			a[i][j] = s.xx[i][j]
		}
		a[i][i] += ridge
		a[i][speedDims] = s.xt[i] + ridge*priorFit[i]
	}
	fit, ok := solve(a)
	if !ok {
		return
	}
	s.fit = fit
	s.read()
}

// read sets the model's terms from the fit, each kept physical: a term the
// fit makes negative (noise, or features that did not vary) has no effect
// rather than a negative one.
func (s *speed) read() {
	s.overhead = clamp(s.fit[0], 0, 10)
	if s.rate == 0 || s.fit[1] > 0 {
		s.rate = clamp(workUnit/math.Max(s.fit[1], 1e-9), 100, 1e7)
	}
	s.attn = math.Inf(1)
	if s.fit[2] > 0 {
		s.attn = attnUnit / s.fit[2]
	}
	s.perDecode = clamp(s.fit[3]/decodeUnit, 0, 1)
	s.perToken, s.perAttend = 1/s.rate, 1/s.attn
}

// solve solves a linear system given as an augmented matrix, by Gaussian
// elimination with partial pivoting.
func solve(a [speedDims][speedDims + 1]float64) ([speedDims]float64, bool) {
	const n = speedDims
	for c := range n {
		p := c
		for r := c + 1; r < n; r++ {
			if math.Abs(a[r][c]) > math.Abs(a[p][c]) {
				p = r
			}
		}
		if math.Abs(a[p][c]) < 1e-12 {
			return [n]float64{}, false
		}
		a[c], a[p] = a[p], a[c]
		for r := range n {
			if r == c {
				continue
			}
			f := a[r][c] / a[c][c]
			for k := c; k <= n; k++ {
				a[r][k] -= f * a[c][k]
			}
		}
	}
	var x [n]float64
	for i := range n {
		x[i] = a[i][n] / a[i][i]
	}
	return x, true
}
