package results

import "time"

// PredictionWarmUp is how many predicted requests a run's prediction errors
// leave out at its start: a calibrated predictor is still learning the
// engine there, and an operator wants the error it settles at.
const PredictionWarmUp = 200

// prediction scores a policy's predictions of one latency (the TTFT, the
// time between tokens), one result at a time: the absolute percentage error
// of each prediction past the warm-up and, for those with an interval,
// whether the observed value fell inside it. The errors go through
// Latencies as parts per million, so that a simulation of millions of
// requests keeps a sketch, not every error. Not safe for concurrent use.
type prediction struct {
	seen, scored, bounded, inside int
	ape                           Latencies
}

// ppm scales a ratio into a Duration for Latencies: 1 ns per part per
// million keeps Sketch's relative accuracy for errors from 0.0001 % up.
const ppm = 1e6

// add scores one prediction of a successful request (lo and hi 0: no
// interval); it skips a request without a prediction or an observation.
func (p *prediction) add(predicted, observed, lo, hi time.Duration) {
	if predicted <= 0 || observed <= 0 {
		return
	}
	p.seen++
	if p.seen <= PredictionWarmUp {
		return
	}
	p.scored++
	p.ape.Add(time.Duration(ppm * abs(observed.Seconds()-predicted.Seconds()) / observed.Seconds()))
	if hi > 0 {
		p.bounded++
		if lo <= observed && observed <= hi {
			p.inside++
		}
	}
}

// medianError returns the median absolute percentage error as a fraction
// (0.1 is 10 %), or 0 with nothing scored.
func (p *prediction) medianError() float64 {
	if p.scored == 0 {
		return 0
	}
	return float64(p.ape.Quantile(0.5)) / ppm
}

// coverage returns the share of scored requests with an interval whose
// value fell inside it, or 0 with none.
func (p *prediction) coverage() float64 {
	if p.bounded == 0 {
		return 0
	}
	return float64(p.inside) / float64(p.bounded)
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
