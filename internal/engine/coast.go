package engine

import "time"

// A coast is a run of decode steps that nobody needs to see one at a time:
// every running request computes one token, none produces its first or its
// last, nothing waits to be admitted and no block must be evicted from a
// running request. Each such step is what Step would do, and a simulator
// that stepped through them would only carry each step's end to the next.
// Coast lets it take the whole run as one event instead: most of an
// engine's steps are decodes, and most of a simulation's time went to
// stepping through them.
//
// A coast is applied lazily. While it is in flight the engine's requests and
// counters are those of the last step applied; Settle applies the steps
// begun by a given time, exactly as Step would have, one after another; Cut
// does that and ends the run with the step then in flight, so that a new
// request can join the next. The steps' durations, block allocations and
// publications are those of the same steps taken by Step, in the same order
// (TestCoastIdentical checks every request's timings and every counter).
type coast struct {
	active bool
	left   int           // steps not applied yet
	at     time.Duration // start of the next step to apply
	end    time.Duration // end of the run
}

// Coast starts at now a run of at most limit silent decode steps (see coast)
// and returns its end, or now when the next step cannot be silent (then
// call Step). Until the run ends, call Settle before reading the engine's
// state and Cut before adding or aborting a request; Step and Coast may be
// called again only at the run's end, after Settle.
func (e *Engine) Coast(now time.Duration, limit int) time.Duration {
	if e.co.active || limit < 1 || e.waiting.len() > 0 || e.pending.len() > 0 || len(e.running) == 0 || len(e.running) > e.p.MaxNumBatchedTokens {
		return now
	}
	steps := limit
	var attended int64
	for _, r := range e.running {
		if r.Output == 0 || r.numTokens()-r.computed != 1 || r.scheduled != 0 {
			return now
		}
		// The step that produces r's last token is not silent.
		steps = min(steps, r.MaxTokens-r.Output-1)
		attended += int64(r.computed)
	}
	// Block allocations must not run out of free blocks: with no block
	// released, allocation k needs k free blocks, and a shortfall preempts.
	if steps > 0 {
		steps = e.stepsWithBlocks(steps, e.kv.free)
	}
	if steps < 1 {
		return now
	}
	end := now
	b := int64(len(e.running))
	for i := range int64(steps) {
		end += e.decodeTime(b, attended+b*i)
	}
	e.co = coast{active: true, left: steps, at: now, end: end}
	return end
}

// stepsWithBlocks returns how many of the next steps (at most limit) allocate
// no more than free blocks in all: a decoding request takes a new block at
// the start of every step that begins with its blocks full.
func (e *Engine) stepsWithBlocks(limit, free int) int {
	bs := e.p.BlockSize
	// The allocations in the first n steps, for every request: those at
	// step offsets (bs - computed%bs)%bs, then every bs steps.
	allocs := func(n int) int {
		total := 0
		for _, r := range e.running {
			first := (bs - r.computed%bs) % bs
			if first < n {
				total += (n-1-first)/bs + 1
			}
		}
		return total
	}
	if allocs(limit) <= free {
		return limit
	}
	lo, hi := 0, limit // allocs(lo) <= free < allocs(hi)
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if allocs(mid) <= free {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// decodeTime is the duration of a decode step of b requests whose contexts
// sum to attended tokens before the step: what StepTime gives for the Work
// that Step adds up for it (each request computes one token, which attends
// to its whole context and reads it with its own).
func (e *Engine) decodeTime(b, attended int64) time.Duration {
	return e.rf.stepTime(Work{Tokens: int(b), AttendedPositions: float64(attended), ContextTokens: int(attended + b), Requests: int(b)})
}

// Settle applies the steps of the coast in flight that have begun by now,
// as Step applies a step's effects at its start, and returns the run's end.
// When now is the run's end, it applies the whole run and ends it. Without a
// coast in flight it does nothing and returns now.
func (e *Engine) Settle(now time.Duration) time.Duration {
	if !e.co.active {
		return now
	}
	e.applyUntil(now)
	end := e.co.end
	if e.co.left == 0 && now >= end {
		e.co = coast{}
	}
	return end
}

// Cut applies the steps of the coast in flight begun by now and ends the
// run with the step then in flight, so that what happens at now (a new
// request) is seen by the step after it, as when stepping one at a time. It
// returns the new end of the run, and false when no coast was in flight.
func (e *Engine) Cut(now time.Duration) (time.Duration, bool) {
	if !e.co.active {
		return 0, false
	}
	e.applyUntil(now)
	e.co.left = 0
	e.co.end = e.co.at
	end := e.co.end
	if now >= end {
		e.co = coast{}
	}
	return end, true
}

// applyUntil applies the coast's steps that begin at or before now. After
// it, co.at is the end of the last step applied.
func (e *Engine) applyUntil(now time.Duration) {
	n := 0
	b := int64(len(e.running))
	var attended int64
	for _, r := range e.running {
		attended += int64(r.computed)
	}
	at := e.co.at
	var busy time.Duration
	if now >= e.co.end {
		// The whole rest of the run: its steps' durations sum to its end.
		n, at, busy = e.co.left, e.co.end, e.co.end-e.co.at
	}
	for n < e.co.left && at <= now {
		d := e.decodeTime(b, attended+b*int64(n))
		at += d
		busy += d
		n++
	}
	if n == 0 {
		return
	}
	e.applyDecodes(n)
	e.co.left -= n
	e.co.at = at
	e.stats.Steps += int64(n)
	e.stats.BusyTime += busy
	e.stats.GenerationTokens += int64(n) * b
	for _, r := range e.running {
		r.LastToken = at
	}
}

// applyDecodes applies n decode steps to every running request: per step,
// first the blocks each request needs (in the order Step reserves them),
// then the blocks each one completes are published (in the same order). A
// stretch of steps in which no request starts or completes a block is
// applied at once.
func (e *Engine) applyDecodes(n int) {
	bs := e.p.BlockSize
	for n > 0 {
		// Steps until the first in which some request starts a new block
		// (computed%bs == 0 at the step's start) or completes one
		// (computed%bs == bs-1).
		quiet := n
		for _, r := range e.running {
			m := r.computed % bs
			if m == 0 {
				quiet = 0
				break
			}
			quiet = min(quiet, bs-1-m)
		}
		if quiet > 0 {
			for _, r := range e.running {
				r.computed += quiet
				r.Output += quiet
			}
			n -= quiet
			continue
		}
		for _, r := range e.running {
			if r.computed%bs == 0 {
				var evicted int
				r.blocks, evicted = e.kv.allocate(r.blocks, 1)
				e.stats.EvictedBlocks += int64(evicted)
			}
		}
		for _, r := range e.running {
			e.publish(r, r.computed, r.computed+1)
			r.computed++
			r.Output++
		}
		n--
	}
}
