package calibrate

import "math"

// fit holds the decayed sums of one weighted least-squares fit. It is owned
// by a Model and guarded by its mutex.
type fit struct {
	n float64                 // decayed count of observations
	a [MaxDim][MaxDim]float64 // decayed Σ w x xᵀ, lower triangle
	b [MaxDim]float64         // decayed Σ w x y
}

// add decays the sums by decay and adds observation (x, y) with weight w.
func (f *fit) add(x []float64, y, w, decay float64) {
	f.n = f.n*decay + 1
	for i, xi := range x {
		row := &f.a[i]
		for j := 0; j <= i; j++ {
			row[j] = row[j]*decay + w*xi*x[j]
		}
		f.b[i] = f.b[i]*decay + w*xi*y
	}
}

// ridgeShare is the weight of the diagonal part of the penalty beside the
// part in prediction space (see solve): enough to pin the coefficients of
// features that move together (the prior and the uncached tokens it is
// computed from), too little to matter where the data decides.
const ridgeShare = 0.1

// solve writes into theta (length d) the θ minimising
//
//	Σ w (y − θ·x)² + κ (θ − ref)ᵀ P (θ − ref),  P = (G + ridgeShare·diag G)/n_g,
//
// G and n_g being the sums Σ w x xᵀ and the count of the fit g (the fleet's
// for a backend, the fleet's own for the fleet), and reports whether it
// could. Its first part, κ·mean over g's traffic of w ((θ − ref)·x)², counts
// in observations how far θ predicts from ref on the traffic seen, so a fit
// with n observations lands n/(n + κ) of the way from ref to its own least
// squares whatever the features' units; its diagonal part keeps the system
// well posed where features are collinear or never vary, and is floored so
// that a feature that was always 0 (not exported, say) keeps ref's
// coefficient. On failure theta is left as it was.
func (f *fit) solve(d int, kappa float64, ref, theta []float64, g *fit) bool {
	if f.n <= 0 || g.n <= 0 {
		return false
	}
	var m [MaxDim][MaxDim]float64
	var r [MaxDim]float64
	top := 0.0
	for j := range d {
		top = max(top, g.a[j][j])
	}
	floor := max(top*1e-9, math.SmallestNonzeroFloat64)
	k := kappa / g.n
	for i := range d {
		r[i] = f.b[i]
		for j := range d {
			p := k * g.a[max(i, j)][min(i, j)]
			if i == j {
				p += k * ridgeShare * max(g.a[i][i], floor)
			}
			r[i] += p * ref[j]
			if j <= i {
				m[i][j] = f.a[i][j] + p
			}
		}
	}
	if !cholesky(&m, d) {
		return false
	}
	substitute(&m, &r, d)
	for _, v := range r[:d] {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return false
		}
	}
	copy(theta, r[:d])
	return true
}

// cholesky factors the symmetric positive definite matrix whose lower
// triangle is m into L Lᵀ, L written over m's lower triangle. It reports
// false when m is not numerically positive definite.
func cholesky(m *[MaxDim][MaxDim]float64, d int) bool {
	for j := range d {
		s := m[j][j]
		for k := range j {
			s -= m[j][k] * m[j][k]
		}
		if !(s > 0) {
			return false
		}
		l := math.Sqrt(s)
		m[j][j] = l
		for i := j + 1; i < d; i++ {
			t := m[i][j]
			for k := range j {
				t -= m[i][k] * m[j][k]
			}
			m[i][j] = t / l
		}
	}
	return true
}

// substitute solves L Lᵀ θ = r in place of r, L from cholesky.
func substitute(l *[MaxDim][MaxDim]float64, r *[MaxDim]float64, d int) {
	for i := range d {
		t := r[i]
		for k := range i {
			t -= l[i][k] * r[k]
		}
		r[i] = t / l[i][i]
	}
	for i := d - 1; i >= 0; i-- {
		t := r[i]
		for k := i + 1; k < d; k++ {
			t -= l[k][i] * r[k]
		}
		r[i] = t / l[i][i]
	}
}
