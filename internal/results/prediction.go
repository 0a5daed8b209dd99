package results

import "time"

// PredictionWarmUp is how many predicted requests a run's TTFT prediction
// error leaves out at its start: a calibrated predictor is still learning the
// engine there, and an operator wants the error it settles at.
const PredictionWarmUp = 200

// ttftPrediction scores a policy's TTFT predictions, one result at a time:
// the absolute percentage error of each prediction past the warm-up and
// whether the observed TTFT fell inside the predicted interval. The errors
// go through Latencies as parts per million, so that a simulation of
// millions of requests keeps a sketch, not every error. Not safe for
// concurrent use.
type ttftPrediction struct {
	seen, scored, inside int
	ape                  Latencies
}

// ppm scales a ratio into a Duration for Latencies: 1 ns per part per
// million keeps Sketch's relative accuracy for errors from 0.0001 % up.
const ppm = 1e6

func (p *ttftPrediction) add(r *Result) {
	if r.Status != 200 || r.PredictedTTFT <= 0 || r.TTFT <= 0 {
		return
	}
	p.seen++
	if p.seen <= PredictionWarmUp {
		return
	}
	p.scored++
	predicted, observed := r.PredictedTTFT.Seconds(), r.TTFT.Seconds()
	p.ape.Add(time.Duration(ppm * abs(observed-predicted) / observed))
	if r.PredictedTTFTLow > 0 && r.PredictedTTFTLow <= r.TTFT && r.TTFT <= r.PredictedTTFTHigh {
		p.inside++
	}
}

// medianError returns the median absolute percentage error as a fraction
// (0.1 is 10 %), or 0 with nothing scored.
func (p *ttftPrediction) medianError() float64 {
	if p.scored == 0 {
		return 0
	}
	return float64(p.ape.Quantile(0.5)) / ppm
}

// coverage returns the share of scored requests whose TTFT fell inside the
// predicted interval, or 0 with nothing scored.
func (p *ttftPrediction) coverage() float64 {
	if p.scored == 0 {
		return 0
	}
	return float64(p.inside) / float64(p.scored)
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
