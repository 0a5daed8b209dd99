package kvroute

import (
	"math"
	"slices"
)

// decodeMixedSpread is how far apart, in log, the slow and the fast end
// of the backends' decode ratios (learner.decodeSlow) must be for the fleet
// to count as mixed: 1.42×. The ends are the 10th and 90th percentiles, the
// slowest and the fastest in a fleet of ten or fewer: over a thousand
// backends of one kind the slowest and the fastest noisy ratio are always
// that far apart. On a fleet of one kind a backend's ratio wanders with
// the load the decode fit does not describe (the simulator's chat,
// chat-long and long-gen on eight H100s: spreads of 1.01–1.05; on the
// batch-slowdown engine, whose steps slow with the batch, up to 1.36),
// while four H100s beside four A100s spread 1.47–1.61 and the fit settles
// between them, each kind within decodeSlowBand of it.
const decodeMixedSpread = 0.35

// decodeMixedEvery is how many streams' decode ratios are learned between
// two looks at the spread, at least: a look sorts the fleet's ratios, so
// a fleet of more backends is looked at once every as many streams.
const decodeMixedEvery = 16

// decodeMixedEvidence is how many priors' worth of predictions a backend's
// decode ratio must rest on to count in the spread, a few dozen
// streams: over its first few streams a backend's ratio says more of them
// than of its GPU.
const decodeMixedEvidence = 3

// decodeMix is a mixed fleet's decode ratios as the cost prices them:
// which backends' ratios rest on decodeMixedEvidence, and the fast end of
// those (their 10th percentile). Immutable once published.
type decodeMix struct {
	known []bool // by backend index
	low   float64
}

// mix returns the fleet's decodeMix, or nil when the live backends with
// enough evidence spread less than decodeMixedSpread. Call with the
// learner's mu held.
func (r *ratios) mix() *decodeMix {
	m := &decodeMix{known: make([]bool, len(r.live))}
	var qs []float64
	for i, live := range r.live {
		if live && r.predicted[i] >= decodeMixedEvidence*r.prior {
			m.known[i] = true
			qs = append(qs, r.observed[i]/r.predicted[i])
		}
	}
	if len(qs) < 2 {
		return nil
	}
	slices.Sort(qs)
	n := float64(len(qs) - 1)
	lo, hi := qs[int(math.Floor(0.1*n))], qs[int(math.Ceil(0.9*n))]
	if math.Log(hi/lo) <= decodeMixedSpread {
		return nil
	}
	m.low = lo
	return m
}

// price is slow_decode(b) for backend i, whose decode ratio is ratio: on a
// fleet of one kind (m nil), 1 within decodeSlowBand of it; on a mixed
// fleet the ratio as learned, where one fit sits between the kinds and
// every backend is off it, and the fastest known ratio for a backend
// without enough streams yet: priced at the prior of 1 it would lose every
// stream to the known fast ones and never show its speed.
func (m *decodeMix) price(i int, ratio float64) float64 {
	switch {
	case m == nil:
		return decodeSlowness(ratio)
	case i < len(m.known) && m.known[i]:
		return ratio
	default:
		return m.low
	}
}

// noteDecodeSpread looks at the decode ratios' spread every
// decodeMixedEvery streams, or every as many as the fleet has backends.
// Call with the learner's mu held.
func (l *learner) noteDecodeSpread() {
	l.decodeSeen++
	if l.decodeSeen%max(decodeMixedEvery, l.decodeSlow.n) == 0 {
		l.decodeMix = l.decodeSlow.mix()
	}
}
