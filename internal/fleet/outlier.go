package fleet

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Outlier ejection takes a backend out of rotation on what the proxy saw of
// its requests, as Envoy's outlier detection does: streaks of gateway
// errors, 5xx answers or timeouts, and, which no other router does, streaks
// of first tokens far slower than the policy predicted. An ejected backend
// stays out for an ejection time that grows with each ejection and comes
// back only when an active health check, started after that time, passes.

// Defaults for OutlierOptions. The error thresholds and ejection times are
// Envoy's documented defaults: operators know them and they have held up in
// fleets far larger than ours.
const (
	// DefaultConsecutiveGatewayErrors is Envoy's consecutive_gateway_failure:
	// three connection failures or 502/503/504 in a row mean the server is
	// gone or restarting, not that it disliked one request.
	DefaultConsecutiveGatewayErrors = 3
	// DefaultConsecutive5xx is Envoy's consecutive_5xx: a 500 can be one bad
	// request, five in a row is the server.
	DefaultConsecutive5xx = 5
	// DefaultConsecutiveTimeouts: three first-token or stream-idle timeouts
	// in a row. A timeout costs a client its whole timeout, so we act as
	// soon as on gateway errors.
	DefaultConsecutiveTimeouts = 3
	// DefaultConsecutiveSlow: five slow first tokens in a row. Slowness is
	// noisier than an error (one long prompt behind a burst is slow for a
	// good reason), so it takes as many as a 5xx streak.
	DefaultConsecutiveSlow = 5
	// DefaultLatencyFactor and DefaultLatencyFloor make a first token slow
	// when TTFT > 4 × predicted + 2 s. The prediction already includes the
	// backend's queue, so a merely busy backend is not slow; predictions
	// are often off by 2× (a burst arrives between scrapes, a prompt's
	// cache hit was a guess), and 4× leaves room for that while still
	// catching the server that really degraded (throttled GPU, KV swapped
	// to host, a noisy neighbour). The floor keeps short requests, whose
	// TTFT of tens of milliseconds is dominated by network and scheduling
	// jitter, from ever counting: 300 ms against a predicted 50 ms is 6×
	// and harmless.
	DefaultLatencyFactor = 4.0
	DefaultLatencyFloor  = 2 * time.Second
	// DefaultBaseEjectionTime is Envoy's base_ejection_time: the first
	// ejection lasts 30 s, the n-th n × 30 s.
	DefaultBaseEjectionTime = 30 * time.Second
	// DefaultMaxEjectionTime is Envoy's max_ejection_time: a flapping
	// backend is retried at least every 5 minutes. It is also how long a
	// returned backend must stay in rotation for its ejections to be
	// forgotten.
	DefaultMaxEjectionTime = 300 * time.Second
	// DefaultMaxEjectionPercent: at most half the fleet ejected at once
	// (Envoy defaults to 10 %, which in a fleet of fewer than ten backends
	// rounds to nothing; Envoy may eject one host anyway, as we do). When
	// most of a fleet looks bad the cause is usually shared (the network,
	// the router, the load) and ejecting more only overloads the rest.
	DefaultMaxEjectionPercent = 50
)

// OutlierOptions configure outlier ejection; the zero value gives the
// defaults. A negative Consecutive* disables that kind of ejection, a
// negative MaxEjectionPercent disables ejection altogether.
type OutlierOptions struct {
	// ConsecutiveGatewayErrors ejects a backend after this many gateway
	// errors (ResultGatewayError) with no success between (default 3).
	ConsecutiveGatewayErrors int
	// Consecutive5xx ejects a backend after this many server errors,
	// gateway errors included, with no success between (default 5).
	Consecutive5xx int
	// ConsecutiveTimeouts ejects a backend after this many timeouts with no
	// success between (default 3).
	ConsecutiveTimeouts int
	// ConsecutiveSlow ejects a backend after this many successes in a row
	// whose TTFT was slow against the policy's prediction (default 5).
	// Successes without a prediction neither count nor break the streak.
	ConsecutiveSlow int
	// LatencyFactor and LatencyFloor define slow: TTFT > LatencyFactor ×
	// Predicted + LatencyFloor (defaults 4 and 2 s).
	LatencyFactor float64
	LatencyFloor  time.Duration
	// BaseEjectionTime is the first ejection's length; the n-th lasts n ×
	// BaseEjectionTime (default 30 s).
	BaseEjectionTime time.Duration
	// MaxEjectionTime caps an ejection's length; a backend that has been
	// back in rotation this long has its ejection count reset (default
	// 300 s).
	MaxEjectionTime time.Duration
	// MaxEjectionPercent caps the share of the fleet ejected at once, in
	// percent of its backends, rounded down but at least one backend when
	// the fleet has two or more (default 50); so below 100 the only backend
	// of a fleet of one is never ejected. Beyond the cap an ejection is
	// refused, and logged once per streak, until another backend returns.
	MaxEjectionPercent int
}

// ResultKind is how one attempt to a backend ended, as the proxy saw it.
type ResultKind uint8

// Result kinds.
const (
	// ResultSuccess is a response the backend produced: 2xx, or a 4xx that
	// is the client's doing.
	ResultSuccess ResultKind = iota
	// ResultGatewayError is a backend that could not be reached or did not
	// answer properly: dial error, connection reset before the headers, or
	// a 502, 503 or 504.
	ResultGatewayError
	// ResultServerError is any other 5xx.
	ResultServerError
	// ResultTimeout is a first-token or stream-idle timeout.
	ResultTimeout
	// ResultOverloaded is a 429: the backend is healthy but full. It is not
	// an error and breaks no streak; tell the fleet with Backoff.
	ResultOverloaded
)

// String returns the kind's name.
func (k ResultKind) String() string {
	switch k {
	case ResultSuccess:
		return "success"
	case ResultGatewayError:
		return "gateway error"
	case ResultServerError:
		return "server error"
	case ResultTimeout:
		return "timeout"
	case ResultOverloaded:
		return "overloaded"
	}
	return "unknown"
}

// Result is one attempt's outcome, reported with Fleet.Report.
type Result struct {
	// Kind is how the attempt ended.
	Kind ResultKind
	// TTFT is the time to the first token of a successful attempt, and
	// Predicted what the routing policy expected it to be for this backend;
	// zero when unknown. Both are needed for latency ejection.
	TTFT, Predicted time.Duration
}

// ResultOf classifies an attempt that got an answer from the backend, for
// Report: by its HTTP status (0: none came), and as a success only when the
// response came whole (complete) with a 2xx. ttft and predicted go into a
// success's Result (zero when the attempt was not timed). It reports false
// when the answer says nothing of the backend's health (no status, a 4xx
// the client caused, a response cut short).
func ResultOf(status int, complete bool, ttft, predicted time.Duration) (Result, bool) {
	switch {
	case status == 0:
		return Result{}, false
	case status == http.StatusTooManyRequests:
		return Result{Kind: ResultOverloaded}, true
	case status == http.StatusBadGateway, status == http.StatusServiceUnavailable, status == http.StatusGatewayTimeout:
		return Result{Kind: ResultGatewayError}, true
	case status >= 500:
		return Result{Kind: ResultServerError}, true
	case complete && status/100 == 2:
		return Result{Kind: ResultSuccess, TTFT: ttft, Predicted: predicted}, true
	}
	return Result{}, false
}

// reason is why a backend was ejected; its name is the metrics label.
type reason uint8

const (
	reasonGateway reason = iota
	reason5xx
	reasonTimeout
	reasonSlow
	numReasons
)

var reasonNames = [numReasons]string{"gateway", "5xx", "timeout", "slow"}

func (r reason) String() string { return reasonNames[r] }

// outliers is a fleet's outlier detector: its settings, fixed at New, and
// how many backends are ejected now.
type outliers struct {
	gateway, fivexx, timeouts, slow int // thresholds; 0 disables
	factor                          float64
	floor, base, maxTime            time.Duration
	pct                             int          // MaxEjectionPercent as given
	limit                           atomic.Int32 // most backends ejected at once, for the fleet's size now
	ejected                         atomic.Int32
}

// init applies o, with defaults, to a fleet of n backends.
func (d *outliers) init(o OutlierOptions, n int) {
	threshold := func(n, def int) int {
		switch {
		case n < 0:
			return 0
		case n == 0:
			return def
		}
		return n
	}
	*d = outliers{
		gateway:  threshold(o.ConsecutiveGatewayErrors, DefaultConsecutiveGatewayErrors),
		fivexx:   threshold(o.Consecutive5xx, DefaultConsecutive5xx),
		timeouts: threshold(o.ConsecutiveTimeouts, DefaultConsecutiveTimeouts),
		slow:     threshold(o.ConsecutiveSlow, DefaultConsecutiveSlow),
		factor:   o.LatencyFactor,
		floor:    o.LatencyFloor,
		base:     positive(o.BaseEjectionTime, DefaultBaseEjectionTime),
		maxTime:  positive(o.MaxEjectionTime, DefaultMaxEjectionTime),
		pct:      o.MaxEjectionPercent,
	}
	d.resize(n)
	if d.factor <= 0 {
		d.factor = DefaultLatencyFactor
	}
	if d.floor <= 0 {
		d.floor = DefaultLatencyFloor
	}
	d.maxTime = max(d.maxTime, d.base)
}

// resize sets the ejection cap for a fleet of n backends (Fleet.Update).
func (d *outliers) resize(n int) { d.limit.Store(int32(ejectionLimit(n, d.pct))) }

// ejectionLimit is how many of n backends may be ejected at once with a cap
// of pct percent.
func ejectionLimit(n, pct int) int {
	switch {
	case pct < 0:
		return 0
	case pct == 0:
		pct = DefaultMaxEjectionPercent
	}
	limit := n * min(pct, 100) / 100
	if n >= 2 {
		limit = max(limit, 1)
	}
	return limit
}

// reserve takes one of the ejection slots, or reports that none is left.
func (d *outliers) reserve() bool {
	for {
		n := d.ejected.Load()
		if n >= d.limit.Load() {
			return false
		}
		if d.ejected.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// outlierState is one backend's outlier detection.
type outlierState struct {
	// ejected and backoff are read on the hot path. backoff is the Unix time
	// in nanoseconds until which the backend is avoided, 0 for none.
	ejected atomic.Bool
	backoff atomic.Int64
	// ejections count ejections by reason, refusals the ejections refused
	// by the cap (once per streak), for metrics.
	ejections [numReasons]atomic.Uint64
	refusals  atomic.Uint64

	mu sync.Mutex // guards the fields below and changes of ejected
	// The current streaks.
	gateway, fivexx, timeouts, slow int
	// times counts ejections since the count was last forgotten.
	times int
	// ejectedAt and until bound the current ejection; returned is when the
	// backend last came back.
	ejectedAt, until, returned time.Time
	// refused is set when an ejection was refused, to log it once.
	refused bool
	// removed is set when the backend leaves the fleet (Update): a report
	// that raced with the removal must not eject it and take a slot.
	removed bool
}

// observe adds r to o's streaks and returns the streak that crossed its
// threshold, if any. o.mu must be held.
func (d *outliers) observe(o *outlierState, r Result) (why reason, streak int, eject bool) {
	switch r.Kind {
	case ResultSuccess:
		// Only a success breaks a streak. Envoy also breaks the gateway
		// streak on a plain 5xx; we don't: any mix of failures with no
		// success between is a sick server.
		o.gateway, o.fivexx, o.timeouts = 0, 0, 0
		if r.TTFT > 0 && r.Predicted > 0 {
			if d.isSlow(r.TTFT, r.Predicted) {
				o.slow++
			} else {
				o.slow = 0
			}
		}
	case ResultGatewayError:
		o.gateway++
		o.fivexx++ // a gateway error is a 5xx too, as in Envoy
	case ResultServerError:
		o.fivexx++
	case ResultTimeout:
		o.timeouts++
	default:
		return 0, 0, false
	}
	switch {
	case crossed(o.gateway, d.gateway):
		return reasonGateway, o.gateway, true
	case crossed(o.fivexx, d.fivexx):
		return reason5xx, o.fivexx, true
	case crossed(o.timeouts, d.timeouts):
		return reasonTimeout, o.timeouts, true
	case crossed(o.slow, d.slow):
		return reasonSlow, o.slow, true
	}
	return 0, 0, false
}

func crossed(streak, threshold int) bool { return threshold > 0 && streak >= threshold }

// isSlow reports whether a first token after ttft is far slower than the
// predicted one.
func (d *outliers) isSlow(ttft, predicted time.Duration) bool {
	return float64(ttft) > d.factor*float64(predicted)+float64(d.floor)
}

// ejectionTime is how long the n-th ejection lasts.
func (d *outliers) ejectionTime(n int) time.Duration {
	if n > int(d.maxTime/d.base) { // also keeps n × base from overflowing
		return d.maxTime
	}
	return min(time.Duration(n)*d.base, d.maxTime)
}

// Report tells the fleet how an attempt to b ended; outlier detection ejects
// b when a streak of failures or slow first tokens crosses its threshold.
// Results that arrive while b is ejected are ignored: they are requests
// sent before the ejection and say nothing new. Backends not in the fleet
// are ignored. Safe for concurrent use; it does no I/O and holds a lock
// only to update a few counters, except on an ejection, which it logs.
func (f *Fleet) Report(b *Backend, r Result) {
	m := f.member(b)
	if m == nil {
		return
	}
	o, d := &m.out, &f.out
	o.mu.Lock()
	if o.ejected.Load() || o.removed {
		o.mu.Unlock()
		return
	}
	why, streak, eject := d.observe(o, r)
	if !eject {
		if r.Kind == ResultSuccess {
			o.refused = false // the streak is over: a new one may log again
		}
		o.mu.Unlock()
		return
	}
	if !d.reserve() {
		first := !o.refused
		o.refused = true
		o.mu.Unlock()
		if first {
			o.refusals.Add(1)
			f.log.Warn("backend ejection refused", "backend", b.Name, "url", m.base, "reason", why.String(),
				"streak", streak, "ejected", d.ejected.Load(), "max_ejected", d.limit.Load())
		}
		return
	}
	now := f.now()
	if o.times > 0 && now.Sub(o.returned) >= d.maxTime {
		o.times = 0 // in rotation long enough: forgiven
	}
	o.times++
	dur := d.ejectionTime(o.times)
	o.ejectedAt, o.until = now, now.Add(dur)
	o.gateway, o.fivexx, o.timeouts, o.slow = 0, 0, 0, 0
	o.refused = false
	o.ejections[why].Add(1)
	o.ejected.Store(true)
	times := o.times
	o.mu.Unlock()
	f.log.Warn("backend ejected", "backend", b.Name, "url", m.base, "reason", why.String(), "streak", streak,
		"ejections", times, "duration", dur, "ejected", d.ejected.Load(), "max_ejected", d.limit.Load())
}

// readmit brings an ejected m back into rotation after a health check that
// started at started passed, if its ejection had ended by then. It is the
// health loop's hook (checkHealth).
func (f *Fleet) readmit(m *member, started time.Time) {
	o := &m.out
	if !o.ejected.Load() {
		return
	}
	o.mu.Lock()
	if !o.ejected.Load() || started.Before(o.until) {
		o.mu.Unlock()
		return
	}
	now := f.now()
	out := now.Sub(o.ejectedAt)
	o.returned = now
	o.ejected.Store(false)
	f.out.ejected.Add(-1)
	o.mu.Unlock()
	f.log.Info("backend returned", "backend", m.b.Name, "url", m.base, "ejected_for", out,
		"ejected", f.out.ejected.Load())
}

// Backoff keeps b out of Candidates and Healthy until until, as a 429's
// Retry-After asks; an earlier until than one already set changes nothing.
// A backoff is capped at MaxEjectionTime from now, so that a server cannot
// take itself out for a day. It is not an ejection: it does not count
// toward MaxEjectionPercent, and b stays Ready. Backends not in the fleet
// are ignored. Safe for concurrent use; it does not block.
func (f *Fleet) Backoff(b *Backend, until time.Time) {
	m := f.member(b)
	if m == nil {
		return
	}
	now := f.now()
	if !until.After(now) {
		return
	}
	if limit := now.Add(f.out.maxTime); until.After(limit) {
		until = limit
	}
	u := until.UnixNano()
	for {
		old := m.out.backoff.Load()
		if old >= u {
			return
		}
		if m.out.backoff.CompareAndSwap(old, u) {
			if old < now.UnixNano() {
				f.log.Debug("backend backing off", "backend", b.Name, "url", m.base, "until", until)
			}
			return
		}
	}
}

// inRotation reports whether m may be given a request now: healthy, not
// ejected and not backing off. It is the hot path: atomics only, and the
// clock only while a backoff is set.
func (f *Fleet) inRotation(m *member) bool {
	if !m.b.Healthy() || m.out.ejected.Load() {
		return false
	}
	u := m.out.backoff.Load()
	if u == 0 {
		return true
	}
	if f.now().UnixNano() < u {
		return false
	}
	m.out.backoff.CompareAndSwap(u, 0) // expired: spare later calls the clock
	return true
}

// Ejected reports whether b is ejected by outlier detection now.
func (f *Fleet) Ejected(b *Backend) bool {
	m := f.member(b)
	return m != nil && m.out.ejected.Load()
}
