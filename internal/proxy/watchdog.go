package proxy

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/router"
)

// firstTokenDeadline is how long t's attempt may take to its first token:
// for a stream, the floor plus the factor times the predicted TTFT (or one
// at fallbackPrefillRate); for a non-streamed response, whose headers come
// with its end, responseDeadline.
func (p *Proxy) firstTokenDeadline(c *call, t *router.Ticket) time.Duration {
	if !c.stream {
		return p.responseDeadline(c, t)
	}
	if p.res.FirstTokenFloor < 0 {
		return -1
	}
	return p.res.FirstTokenFloor + time.Duration(p.res.FirstTokenFactor*float64(predictedTTFT(c, t)))
}

// predictedTTFT is the policy's predicted TTFT for t, or the prompt at
// fallbackPrefillRate when it predicts none.
func predictedTTFT(c *call, t *router.Ticket) time.Duration {
	predicted := t.PredictedTTFT
	if predicted <= 0 && c.req != nil {
		predicted = time.Duration(float64(c.req.PromptTokens) / fallbackPrefillRate * float64(time.Second))
	}
	return predicted
}

// responseDeadline is how long a non-streamed response may take to its
// first byte, which comes with its end: floor + factor × the predicted
// end-to-end time (predicted TTFT, then the output at ResponseTokenTime a
// token), within the response timeout. Requests the policy does not route
// (embeddings and others) get the response timeout
// (docs/decisions/0015-non-streamed-deadline.md).
func (p *Proxy) responseDeadline(c *call, t *router.Ticket) time.Duration {
	limit := p.res.ResponseTimeout
	if c.req == nil || p.res.ResponseFloor < 0 {
		return limit
	}
	out := c.req.MaxTokens
	if out <= 0 {
		out = DefaultResponseTokens
	}
	e2e := predictedTTFT(c, t) + time.Duration(out)*p.res.ResponseTokenTime
	d := p.res.ResponseFloor + time.Duration(p.res.ResponseFactor*float64(e2e))
	if limit >= 0 && limit < d {
		return limit
	}
	return d
}

// fallbackPrefillRate is the prefill speed, in tokens a second, assumed for
// the first-token deadline when the policy predicts no TTFT: a sixth of an
// H100's on an 8B model, so that only a hung backend misses it (a small
// model on CPUs is slower, but its prompts are short: the floor covers it).
const fallbackPrefillRate = 5000.0

// watchdog cancels an attempt when its current deadline passes: first the
// first token's, then the idle timeout's, counted from the latest read.
// A read only notes its time (touch): the timer is not reset per read, which
// would cost a lock of the runtime's timer heap per event; when it fires
// before the stream has been quiet for the whole timeout, it sets itself for
// the rest.
type watchdog struct {
	timer  *time.Timer
	cancel context.CancelCauseFunc
	// watch is what the timer guards: watchNone, watchFirst or watchIdle.
	watch atomic.Int32
	// idleFor is the idle timeout, set before watch turns watchIdle.
	idleFor time.Duration
	// base is the monotonic origin of last, the latest read's time.
	base time.Time
	last atomic.Int64
}

const (
	watchNone int32 = iota
	watchFirst
	watchIdle
)

func newWatchdog(cancel context.CancelCauseFunc) *watchdog {
	w := new(watchdog)
	w.init(cancel)
	return w
}

// init readies a zero watchdog, stopped.
func (w *watchdog) init(cancel context.CancelCauseFunc) {
	w.cancel, w.base = cancel, time.Now()
	w.timer = time.AfterFunc(time.Hour, w.fire)
	w.timer.Stop()
}

// fire runs when the timer passes.
func (w *watchdog) fire() {
	switch w.watch.Load() {
	case watchFirst:
		w.cancel(errFirstTokenTimeout)
	case watchIdle:
		quiet := time.Since(w.base) - time.Duration(w.last.Load())
		if rest := w.idleFor - quiet; rest > 0 {
			w.timer.Reset(rest)
			return
		}
		w.cancel(errIdleTimeout)
	}
}

// firstToken sets the deadline of the first token to d from now; d < 0
// turns it off.
func (w *watchdog) firstToken(d time.Duration) {
	if d < 0 {
		w.stop()
		return
	}
	w.watch.Store(watchFirst)
	w.timer.Reset(d)
}

// idle turns the watch to the idle timeout d, counted from now and then
// from every touch; d < 0 turns it off.
func (w *watchdog) idle(d time.Duration) {
	if d < 0 {
		w.stop()
		return
	}
	w.touch()
	w.idleFor = d
	w.watch.Store(watchIdle)
	w.timer.Reset(d)
}

// touch notes a read: the idle timeout counts from now.
func (w *watchdog) touch() { w.last.Store(int64(time.Since(w.base))) }

func (w *watchdog) stop() {
	w.watch.Store(watchNone)
	w.timer.Stop()
}
