package results

import (
	"math"
	"slices"
	"time"
)

// Sketch summarises positive durations in memory that does not grow with
// their count: a histogram whose buckets grow geometrically, so that every
// quantile it returns is within a relative error Accuracy of the exact one
// (the idea of DDSketch, Masson et al., VLDB 2019). Two sketches merge by
// adding their counts. The zero Sketch is empty and ready to use. Not safe
// for concurrent use.
//
// Bucket k holds the values in (γ^(k-1), γ^k] with γ = (1+α)/(1-α), and
// answers with 2γ^k/(γ+1), which is within α of every value in the bucket.
// A simulation's latencies span nanoseconds to hours: about 3,000 buckets of
// 8 bytes, whatever the number of requests.
type Sketch struct {
	counts []uint64 // counts[i] is bucket offset+i
	offset int
	zeros  uint64 // values ≤ 0
	n      uint64
}

// Accuracy is a Sketch's relative error bound on any quantile.
const Accuracy = 0.005

var (
	sketchGamma    = (1 + Accuracy) / (1 - Accuracy)
	sketchLogGamma = math.Log(sketchGamma)
)

// bucketOf returns the bucket of v > 0.
func bucketOf(v float64) int { return int(math.Ceil(math.Log(v) / sketchLogGamma)) }

// Add counts d once.
func (s *Sketch) Add(d time.Duration) { s.addN(d, 1) }

func (s *Sketch) addN(d time.Duration, c uint64) {
	s.n += c
	if d <= 0 {
		s.zeros += c
		return
	}
	k := bucketOf(float64(d))
	s.cover(k)
	s.counts[k-s.offset] += c
}

// Count returns the number of values added.
func (s *Sketch) Count() int { return int(s.n) }

// Merge adds o's values to s.
func (s *Sketch) Merge(o *Sketch) {
	s.n += o.n
	s.zeros += o.zeros
	if len(o.counts) == 0 {
		return
	}
	s.cover(o.offset)
	s.cover(o.offset + len(o.counts) - 1)
	for i, c := range o.counts {
		s.counts[o.offset+i-s.offset] += c
	}
}

// cover grows the buckets to include bucket k.
func (s *Sketch) cover(k int) {
	switch {
	case len(s.counts) == 0:
		s.offset = k
		s.counts = append(s.counts, 0)
	case k < s.offset:
		s.counts = slices.Insert(s.counts, 0, make([]uint64, s.offset-k)...)
		s.offset = k
	case k >= s.offset+len(s.counts):
		s.counts = append(s.counts, make([]uint64, k-s.offset-len(s.counts)+1)...)
	}
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1) by the nearest-rank method,
// as Percentile does, within Accuracy of it; 0 when empty.
func (s *Sketch) Quantile(q float64) time.Duration {
	if s.n == 0 {
		return 0
	}
	rank := uint64(min(max(int(q*float64(s.n)+0.999999)-1, 0), int(s.n)-1))
	if rank < s.zeros {
		return 0
	}
	seen := s.zeros
	for i, c := range s.counts {
		seen += c
		if seen > rank {
			return time.Duration(2 * math.Pow(sketchGamma, float64(s.offset+i)) / (sketchGamma + 1))
		}
	}
	return 0 // unreachable: the counts add up to n
}

// Latencies collects durations for their percentiles: exactly while there
// are at most ExactLimit of them (every test, every live bench), then in a
// Sketch, so that a simulation of ten million requests keeps kilobytes,
// not gigabytes. The zero value is ready to use.
type Latencies struct {
	exact  []time.Duration
	sketch *Sketch
}

// ExactLimit is how many values Latencies keeps exactly before it sketches
// them: 100,000 durations, 800 KB.
const ExactLimit = 100_000

// Add records d.
func (l *Latencies) Add(d time.Duration) {
	if l.sketch != nil {
		l.sketch.Add(d)
		return
	}
	l.exact = append(l.exact, d)
	if len(l.exact) > ExactLimit {
		l.sketch = &Sketch{}
		for _, v := range l.exact {
			l.sketch.Add(v)
		}
		l.exact = nil
	}
}

// Quantile returns the q-quantile by the nearest-rank method: exact up to
// ExactLimit values, within Accuracy beyond. It may reorder what it holds.
func (l *Latencies) Quantile(q float64) time.Duration {
	if l.sketch != nil {
		return l.sketch.Quantile(q)
	}
	return Percentile(l.exact, q)
}
