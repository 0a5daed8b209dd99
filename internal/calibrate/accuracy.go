package calibrate

import (
	"math"
	"slices"
	"sync"
)

// DefaultWarmup is the number of observations, fleet-wide, that Accuracy
// does not score: the first 200 requests, in which a model meeting a new
// engine is still learning it.
const DefaultWarmup = 200

// RatioBuckets are the upper bounds of the histogram of observed/predicted,
// symmetric in log around 1 (0.8 and 1.25, 0.5 and 2, …) so that a
// prediction too low and one too high by the same factor look alike.
var RatioBuckets = []float64{0.25, 0.5, 0.67, 0.8, 0.91, 1, 1.1, 1.25, 1.5, 2, 4}

// Sample is one prediction and what was observed, in seconds.
type Sample struct {
	Predicted, Lo, Hi, Observed float64
}

// Summary scores predictions.
type Summary struct {
	N         int     // samples scored: Predicted and Observed positive
	MedianAPE float64 // median of |Predicted − Observed| / Observed
	MeanAPE   float64 // mean of the same, which one bad prediction moves
	Coverage  float64 // share of samples with Lo ≤ Observed ≤ Hi
}

// Summarize scores samples, for the bench and simulator tables; it skips
// samples whose Predicted or Observed is not positive. It does not modify
// samples.
func Summarize(samples []Sample) Summary {
	apes := make([]float64, 0, len(samples))
	var sum float64
	inside := 0
	for _, s := range samples {
		if !(s.Predicted > 0) || !(s.Observed > 0) {
			continue
		}
		ape := math.Abs(s.Predicted-s.Observed) / s.Observed
		apes = append(apes, ape)
		sum += ape
		if s.Lo <= s.Observed && s.Observed <= s.Hi {
			inside++
		}
	}
	if len(apes) == 0 {
		return Summary{}
	}
	slices.Sort(apes)
	n := len(apes)
	med := apes[n/2]
	if n%2 == 0 {
		med = (apes[n/2-1] + apes[n/2]) / 2
	}
	return Summary{N: n, MedianAPE: med, MeanAPE: sum / float64(n), Coverage: float64(inside) / float64(n)}
}

// The absolute percentage errors behind the online median are counted in
// geometric bins: bin 0 holds errors below apeMin, bin k ≥ 1 those in
// [apeMin·apeGrowth^(k−1), apeMin·apeGrowth^k), the last everything above
// 100×. A median read off them is within 2.5 % of itself.
const (
	apeBins   = 240
	apeMin    = 0.001
	apeGrowth = 1.05
)

// tally is one backend's (or the fleet's) score.
type tally struct {
	name          string
	count, scored uint64
	// bounded counts the scored predictions that came with an interval
	// (Hi > 0), inside those whose observation fell in it.
	bounded, inside uint64
	ape             [apeBins]uint32
	ratio           []uint64 // by RatioBuckets, not cumulative; the last is +Inf
	ratioSum        float64
}

func newTally() *tally { return &tally{ratio: make([]uint64, len(RatioBuckets)+1)} }

func (t *tally) add(p Prediction, observed float64, score bool) {
	t.count++
	r := observed / p.Mean
	t.ratio[sortSearch(RatioBuckets, r)]++
	t.ratioSum += r
	if !score {
		return
	}
	t.scored++
	if p.Hi > 0 {
		t.bounded++
		if p.Lo <= observed && observed <= p.Hi {
			t.inside++
		}
	}
	ape := math.Abs(p.Mean-observed) / observed
	k := 0
	if ape >= apeMin {
		k = 1 + int(math.Log(ape/apeMin)/math.Log(apeGrowth))
	}
	t.ape[min(k, apeBins-1)]++
}

// sortSearch returns the first bucket whose bound is ≥ v (Prometheus's le).
func sortSearch(bounds []float64, v float64) int {
	i, _ := slices.BinarySearch(bounds, v)
	return i
}

// median returns the median absolute percentage error of the scored
// observations, interpolated within its bin; NaN with none.
func (t *tally) median() float64 {
	if t.scored == 0 {
		return math.NaN()
	}
	half := float64(t.scored) / 2
	cum := 0.0
	for k, c := range t.ape {
		if c == 0 || cum+float64(c) < half {
			cum += float64(c)
			continue
		}
		lo, hi := 0.0, apeMin
		if k > 0 {
			lo = apeMin * math.Pow(apeGrowth, float64(k-1))
			hi = lo * apeGrowth
		}
		return lo + (half-cum)/float64(c)*(hi-lo)
	}
	return math.NaN()
}

// Stats is one backend's score, or the fleet's.
type Stats struct {
	Name      string  // as set by SetName; "" for the fleet
	Count     uint64  // observations recorded
	Scored    uint64  // of them after the warm-up
	MedianAPE float64 // median absolute percentage error of the scored; NaN with none
	Coverage  float64 // share of the scored inside their interval; NaN with none
	// Ratio counts observed/predicted by RatioBuckets, cumulative (as a
	// Prometheus histogram's buckets), over every observation recorded;
	// RatioSum is their sum.
	Ratio    []uint64
	RatioSum float64
}

// AccuracySnapshot is an Accuracy's score at one moment.
type AccuracySnapshot struct {
	Kind     string  // what is predicted: "ttft", "itl"
	Fleet    Stats   // over every backend
	Backends []Stats // by backend index; Name "" for a backend not named
}

// Accuracy keeps score of one kind of prediction, per backend and
// fleet-wide: how many, the median absolute percentage error and the
// interval's coverage after a warm-up, and a histogram of observed over
// predicted. It is a prometheus.Collector of kvroute_prediction_ratio,
// kvroute_prediction_coverage_ratio and kvroute_prediction_ape_median,
// labelled kind and backend. The scores are over all time since a backend's Reset (rate
// the histogram for a recent window); the warm-up counts the fleet's
// observations, so that a backend joining a warm fleet is scored at once,
// as the fleet's fit predicts for it. Safe for concurrent use: every
// method takes a mutex, none is for a hot path.
type Accuracy struct {
	kind     string
	descs    accuracyDescs
	warmup   uint64
	mu       sync.Mutex
	fleet    *tally
	backends []*tally
}

// NewAccuracy returns an Accuracy for predictions of kind ("ttft", "itl"),
// which skips the first warmup observations fleet-wide (DefaultWarmup is
// the 200; a negative warmup is 0).
func NewAccuracy(kind string, warmup int) *Accuracy {
	return &Accuracy{kind: kind, descs: newAccuracyDescs(kind), warmup: uint64(max(warmup, 0)), fleet: newTally()}
}

// Record scores prediction p against the latency observed on backend i, in
// seconds. It ignores a negative i, a Mean or observed that is not
// positive. Safe for concurrent use.
func (a *Accuracy) Record(i int, p Prediction, observed float64) {
	if i < 0 || !(p.Mean > 0) || !(observed > 0) || math.IsInf(observed, 0) {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	score := a.fleet.count >= a.warmup
	a.fleet.add(p, observed, score)
	a.backend(i).add(p, observed, score)
}

// backend returns backend i's tally, growing the table. Call with mu held.
func (a *Accuracy) backend(i int) *tally {
	for len(a.backends) <= i {
		a.backends = append(a.backends, newTally())
	}
	return a.backends[i]
}

// SetName names backend i in the metrics; only named backends have series
// of their own, which bounds the labels by the fleet. Safe for concurrent
// use.
func (a *Accuracy) SetName(i int, name string) {
	if i < 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.backend(i).name = name
}

// Reset forgets backend i's score and name, for a backend that left (its
// series disappear) or restarted. The fleet's score keeps what it
// contributed. Safe for concurrent use.
func (a *Accuracy) Reset(i int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if i >= 0 && i < len(a.backends) {
		a.backends[i] = newTally()
	}
}

// Snapshot returns the current scores. Safe for concurrent use.
func (a *Accuracy) Snapshot() AccuracySnapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := AccuracySnapshot{Kind: a.kind, Fleet: a.fleet.stats(), Backends: make([]Stats, len(a.backends))}
	for i, t := range a.backends {
		s.Backends[i] = t.stats()
	}
	return s
}

func (t *tally) stats() Stats {
	s := Stats{Name: t.name, Count: t.count, Scored: t.scored, MedianAPE: t.median(), Coverage: math.NaN(),
		Ratio: make([]uint64, len(RatioBuckets)), RatioSum: t.ratioSum}
	if t.bounded > 0 {
		s.Coverage = float64(t.inside) / float64(t.bounded)
	}
	cum := uint64(0)
	for k := range RatioBuckets {
		cum += t.ratio[k]
		s.Ratio[k] = cum
	}
	return s
}
