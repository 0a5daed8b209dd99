package workload

import (
	"math/rand/v2"
	"slices"
	"time"
)

// Some traces log arrivals at a coarse resolution: every timestamp of
// Mooncake's conversation trace is a multiple of 3 s (to the millisecond:
// it ends in 000 ms, or 999 ms and a few in 001–003 ms), every tick of
// 3 s has requests (2–28, 10 at the median) and none falls between, so
// on replay each tick's requests arrive at one instant, a burst that the
// real service never saw. Options.SpreadArrivals undoes that: the requests whose timestamps
// round to the same multiple k of the quantum q are spread over
// [k·q, (k+1)·q), in the trace's order, at the sorted values of as many
// uniform draws. That is exactly how a Poisson process places a known
// number of arrivals in an interval, so it adds no regularity the trace
// does not have; spreading them evenly would (a metronome's arrivals are
// kinder to a router than any real stream's). The interval is the one
// after the quantum's mark, on the reading that a logger writing whole
// seconds truncates (the 999 ms values are a millisecond's rounding
// below the mark, and round to it; which side of the mark a tick's
// requests came from shifts them all alike and changes no statistic). The draws depend on the seed only:
// a run is reproduced by its seed, and different seeds measure how much a
// result owes to where in its second each request happened to fall.
//
// It is applied to the trace's own timestamps, before Compress divides
// them, so the quantum is scaled like the rest of the trace.

// Spread is how a workload's arrivals were spread (Options.SpreadArrivals):
// enough to draw other copies of the same trace's seconds, as the
// simulator's --tile does, each spread on its own.
type Spread struct {
	// Quantum is the interval each group of requests was spread over, in
	// model time (after Compress).
	Quantum  time.Duration
	q        time.Duration // in trace time
	compress float64
	seed     uint64
	cells    []spreadCell
	cellOf   []int32 // per session, its cell
	rankOf   []int32 // per session, its place in its cell
}

// spreadCell is the n sessions whose timestamps share one quantum mark,
// spread from it (in trace time).
type spreadCell struct {
	mark time.Duration
	n    int32
}

// spreadStream keeps the spread's draws apart from every other use of the
// workload's seed.
const spreadStream = 0x737072656164

// spreadTrace spreads the arrivals of ss, the sessions made from a trace
// in its order, whose raw (uncompressed) timestamps are raw, over quantum
// q of trace time, and returns the spread. compress is what divides
// trace time into model time.
func spreadTrace(ss []Session, raw []time.Duration, q time.Duration, compress float64, seed uint64) *Spread {
	sp := &Spread{Quantum: time.Duration(float64(q) / compress), q: q, compress: compress, seed: seed,
		cellOf: make([]int32, len(ss)), rankOf: make([]int32, len(ss))}
	// Group by the nearest quantum mark, in the trace's order (a trace
	// whose timestamps went back in time would keep each session's mark;
	// the workload's sort puts them in place).
	byMark := map[time.Duration]int32{}
	for i, t := range raw {
		mark := (t + q/2) / q * q
		c, ok := byMark[mark]
		if !ok {
			c = int32(len(sp.cells))
			byMark[mark] = c
			sp.cells = append(sp.cells, spreadCell{mark: mark})
		}
		sp.cellOf[i], sp.rankOf[i] = c, sp.cells[c].n
		sp.cells[c].n++
	}
	var (
		offs []float64
		last = -1
	)
	for i := range ss {
		c := int(sp.cellOf[i])
		if c != last {
			offs, last = sp.offsets(offs, 0, c), c
		}
		ss[i].Start = sp.at(c, offs[sp.rankOf[i]])
	}
	return sp
}

// offsets returns into dst, sorted, the n uniform draws in [0, 1) that
// place the n sessions of cell c in copy (0: the workload's own Starts).
func (sp *Spread) offsets(dst []float64, copy, c int) []float64 {
	rng := rand.New(rand.NewPCG(sp.seed^spreadStream, uint64(copy)<<32|uint64(c)))
	dst = dst[:0]
	for range sp.cells[c].n {
		dst = append(dst, rng.Float64())
	}
	slices.Sort(dst)
	return dst
}

// at is the model time at offset off into cell c: computed in trace time,
// where a cell's last offset stays below the next mark, then compressed
// (monotonic), so that the copies' cells never overlap.
func (sp *Spread) at(c int, off float64) time.Duration {
	t := sp.cells[c].mark + time.Duration(off*float64(sp.q))
	return time.Duration(float64(t) / sp.compress)
}

// Copy returns the start of session i in copy number copy of the trace,
// spread on its own draws; copy 0 is the session's Start. scratch holds
// the cell's draws between calls: a caller walking one copy's sessions
// in order draws each cell once.
func (sp *Spread) Copy(i, copy int, scratch *SpreadScratch) time.Duration {
	c := int(sp.cellOf[i])
	if !scratch.valid || scratch.cell != c || scratch.copy != copy {
		scratch.offs = sp.offsets(scratch.offs, copy, c)
		scratch.cell, scratch.copy, scratch.valid = c, copy, true
	}
	return sp.at(c, scratch.offs[sp.rankOf[i]])
}

// SpreadScratch is Spread.Copy's memory of the last cell drawn.
type SpreadScratch struct {
	offs       []float64
	cell, copy int
	valid      bool
}

// reorder follows the workload's sort of its sessions: perm[j] is the
// old index of the session now at j.
func (sp *Spread) reorder(perm []int) {
	cellOf, rankOf := make([]int32, len(perm)), make([]int32, len(perm))
	for j, old := range perm {
		cellOf[j], rankOf[j] = sp.cellOf[old], sp.rankOf[old]
	}
	sp.cellOf, sp.rankOf = cellOf, rankOf
}
