package fleetpage

import (
	"time"
)

// Window and sampling of the page's rates. Counters are read when the page
// asks (nothing runs while no one looks), so the window fills from the
// first view; View.WindowSeconds says how much of it there is.
const (
	// DefaultWindow is the span of the "last minute" counts.
	DefaultWindow = time.Minute
	// sampleEvery is the spacing of the samples kept: the window's start is
	// known to this much, and it holds DefaultWindow/sampleEvery+2 samples
	// however often pages poll.
	sampleEvery = 5 * time.Second
)

// counters are cumulative counts by key (what counts and for whom, e.g.
// served, backend and reason), as read at one moment.
type counters map[key]float64

// key names one cumulative count: its kind and up to two labels.
type key struct{ kind, a, b string }

// Kinds of counts the window keeps.
const (
	kindServed      = "served"   // a: backend, b: route reason
	kindTTFTSum     = "ttft_sum" // a: backend; seconds
	kindTTFTCount   = "ttft_count"
	kindPrompt      = "prompt" // a: backend; prompt tokens reported
	kindCached      = "cached" // a: backend; cached prompt tokens reported
	kindEngineHits  = "engine_hits"
	kindEngineQuery = "engine_queries"
	kindRetries     = "retries"    // a: reason
	kindMigrations  = "migrations" // a: outcome
	kindRejected    = "rejected"   // a: reason
)

// sample is the counters at one moment.
type sample struct {
	at time.Time
	c  counters
}

// window keeps samples of the counters, spaced at least every apart, back to
// span ago: the difference between now and the oldest is the count of the
// last span. Not safe for concurrent use (the Page serializes views).
type window struct {
	span, every time.Duration
	samples     []sample // oldest first
}

// add records c at now and returns the sample the window starts at: the
// newest at least span old, else the oldest held (then the window is
// shorter than span). The first call returns c itself: a window of nothing.
func (w *window) add(now time.Time, c counters) sample {
	if n := len(w.samples); n == 0 || now.Sub(w.samples[n-1].at) >= w.every {
		w.samples = append(w.samples, sample{now, c})
	}
	// Drop the samples older than the newest one at least span old.
	start := 0
	for i, s := range w.samples {
		if now.Sub(s.at) >= w.span {
			start = i
		}
	}
	if start > 0 {
		w.samples = append(w.samples[:0], w.samples[start:]...)
	}
	return w.samples[0]
}

// delta returns now's count of k minus base's: what was counted in the
// window. A counter that went back (a backend that restarted its engine)
// counts from zero.
func delta(now, base counters, k key) float64 {
	d := now[k] - base[k]
	if d < 0 {
		return now[k]
	}
	return d
}
