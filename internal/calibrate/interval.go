package calibrate

import "math"

// The log ratios log(observed/predicted) behind the prediction intervals are
// kept in a decayed histogram: bins of ratioWidth centred on 0 (a prediction
// exactly right falls in the middle of a bin, not on an edge), from
// e^−2.5 ≈ 0.08× to e^2.5 ≈ 12×. A ratio beyond falls in the end bins, so no
// interval is wider than that; the linear interpolation within a bin keeps
// the quantiles to a fraction of its 2.5 % width.
const (
	ratioBins  = 201
	ratioWidth = 0.025
	ratioMin   = -ratioBins * ratioWidth / 2
)

// priorSpread is the standard deviation of log(observed/predicted) assumed
// before any observation, worth one observation in the fleet's histogram:
// about a factor 1.9 either way for the 80 % interval, honest for a built-in
// model that has not met the engine yet.
const priorSpread = 0.5

// logRatios is a decayed histogram of log(observed/predicted). It is owned
// by a Model and guarded by its mutex.
type logRatios struct {
	w [ratioBins]float64
	n float64 // Σ w: the decayed count of observations
}

// seed sets h to a normal distribution of log ratios with standard
// deviation sd, worth one observation.
func (h *logRatios) seed(sd float64) {
	*h = logRatios{}
	total := 0.0
	for k := range h.w {
		c := ratioMin + (float64(k)+0.5)*ratioWidth
		h.w[k] = math.Exp(-c * c / (2 * sd * sd))
		total += h.w[k]
	}
	for k := range h.w {
		h.w[k] /= total
	}
	h.n = 1
}

// add decays h by decay and counts the log ratio r.
func (h *logRatios) add(r, decay float64) {
	for k := range h.w {
		h.w[k] *= decay
	}
	h.n = h.n*decay + 1
	k := int(math.Floor((r - ratioMin) / ratioWidth))
	h.w[min(max(k, 0), ratioBins-1)]++
}

// interval returns e^qlo and e^qhi, qlo and qhi the quantiles q of the log
// ratios in own pooled with pool's, which weigh as many observations as
// weight. pool may be nil. It returns (1, 1) for an empty histogram.
func interval(own, pool *logRatios, weight float64, q [2]float64) (lo, hi float64) {
	scale, total := 0.0, own.n
	if pool != nil && pool.n > 0 && weight > 0 {
		scale = weight / pool.n
		total += weight
	}
	if !(total > 0) {
		return 1, 1
	}
	want := [2]float64{q[0] * total, q[1] * total}
	got := [2]float64{ratioMin + ratioBins*ratioWidth, ratioMin + ratioBins*ratioWidth}
	next, cum := 0, 0.0
	for k := 0; k < ratioBins && next < 2; k++ {
		wk := own.w[k]
		if scale > 0 {
			wk += scale * pool.w[k]
		}
		for next < 2 && cum+wk >= want[next] && wk > 0 {
			got[next] = ratioMin + (float64(k)+(want[next]-cum)/wk)*ratioWidth
			next++
		}
		cum += wk
	}
	return math.Exp(got[0]), math.Exp(got[1])
}
