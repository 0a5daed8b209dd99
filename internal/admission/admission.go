// Package admission decides, for each generation request, whether it runs
// now, waits in a bounded queue or is turned away with a time to retry:
// overload is answered, not absorbed.
//
// A Controller caps the requests admitted at once (MaxInFlight) and asks the
// caller whether a request could run at all (canRun: some backend it may go
// to is below its own cap). What cannot run waits in a queue ordered by
// priority class, then by fair queueing over tenants weighted by tokens, then
// first come, first served; the queue is bounded in length (MaxQueue) and in
// time (QueueTimeout), and a request whose deadline its predicted time to
// first token cannot meet is turned away at once. Every release admits the
// next waiters in that order.
//
// The queue is strict: while its head cannot run, nobody behind it is
// admitted. Requests that compete for different backends (different models,
// different pools) belong in different Controllers.
package admission

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of the Config fields; see each field for why.
const (
	DefaultMaxInFlight  = 1024
	DefaultMaxQueue     = 1024
	DefaultQueueTimeout = 30 * time.Second
)

// DefaultMaxPerBackend is the default cap of generation requests in flight
// on one backend, past which a front queues them: vLLM's max_num_seqs, past
// which an engine only queues.
const DefaultMaxPerBackend = 256

// Config configures a Controller. The zero value of each field means its
// default.
type Config struct {
	// MaxInFlight caps the requests admitted and not yet released, over all
	// classes and backends. Default 1024; negative: no cap. It protects the
	// router itself (goroutines, connections, buffered request bodies): the
	// backends' own saturation is what canRun reports, and 1024 is above
	// what a few vLLM replicas run at once (256 to 1024 sequences each), so
	// by default it binds only when the fleet is large or canRun is absent.
	MaxInFlight int
	// MaxQueue caps the requests waiting, over all classes. Default 1024;
	// negative: no queue (what cannot run at once is rejected). A longer
	// queue only turns a 429 now into a timeout later: at the drain rate of
	// a busy router (a thousand requests of ~10 s each in flight release
	// about 100 a second) 1024 waiters clear in ~10 s, well within
	// QueueTimeout.
	MaxQueue int
	// QueueTimeout is the longest a request waits for admission before it is
	// rejected with ErrQueueTimeout. Default 30 s. Slots free up as
	// generations end, seconds to minutes apart, so a short timeout rejects
	// requests that would soon have run; but a queued request sends nothing
	// to its client, a chat user has given up by half a minute, and 30 s
	// stays under the 60 s idle timeouts of common load balancers in front
	// of the router. Negative is an error.
	QueueTimeout time.Duration
	// Registerer, if not nil, gets the controller's metrics
	// (kvroute_admission_*). A registry takes one Controller; for several,
	// give each prometheus.WrapRegistererWith(prometheus.Labels{"pool":
	// name}, reg).
	Registerer prometheus.Registerer
	// Now reads the clock. Default time.Now; tests inject a fake.
	Now func() time.Time
	// After starts a queue timer, as time.After. Default time.After; tests
	// inject a fake that fires when they advance their clock. It is called
	// with the controller's lock held, so it must not call the Controller.
	After func(d time.Duration) <-chan time.Time
}

// Entry describes a request asking for admission.
type Entry struct {
	// Class is the request's priority; out of range counts as Sheddable.
	// Its zero value is Critical: set it from ParseClass, which gives
	// Standard to a request that names no class.
	Class Class
	// Tenant names the fairness flow: the API key's name or the
	// X-Kvroute-Tenant header. Requests without one share the "" tenant.
	Tenant string
	// Tokens is the request's cost for fairness between tenants: the
	// estimated prompt tokens plus the maximum output tokens. Below 1 counts
	// as 1.
	Tokens int64
	// Deadline is how long the client grants the request to its first
	// token, counted from the call to Acquire (the caller subtracts time
	// already spent); 0 means none.
	Deadline time.Duration
	// PredictedTTFT is the predicted time to first token once admitted; with
	// a Deadline, a request whose PredictedTTFT plus expected queue wait
	// exceeds it is rejected with ErrDeadline, and a queued one is rejected
	// as soon as its wait has used up the slack.
	PredictedTTFT time.Duration
}

// Stats is a snapshot of a Controller.
type Stats struct {
	// InFlight is the requests admitted and not yet released.
	InFlight int
	// Queued is the requests waiting, by class.
	Queued [NumClasses]int
	// DrainRate is the estimated releases per second; 0 until the first.
	DrainRate float64
}

// Controller admits, queues or rejects requests. Safe for concurrent use.
type Controller struct {
	maxInFlight int
	maxQueue    int
	timeout     time.Duration
	now         func() time.Time
	after       func(time.Duration) <-chan time.Time
	m           *metrics

	mu       sync.Mutex
	inFlight int
	queued   int
	seq      uint64
	classes  [NumClasses]classQueue
	drain    drainRate
}

// New returns a Controller for cfg, with its metrics registered on
// cfg.Registerer.
func New(cfg Config) (*Controller, error) {
	if cfg.QueueTimeout < 0 {
		return nil, fmt.Errorf("admission: QueueTimeout %v is negative", cfg.QueueTimeout)
	}
	c := &Controller{
		maxInFlight: cfg.MaxInFlight,
		maxQueue:    cfg.MaxQueue,
		timeout:     cfg.QueueTimeout,
		now:         cfg.Now,
		after:       cfg.After,
	}
	switch {
	case c.maxInFlight == 0:
		c.maxInFlight = DefaultMaxInFlight
	case c.maxInFlight < 0:
		c.maxInFlight = math.MaxInt
	}
	switch {
	case c.maxQueue == 0:
		c.maxQueue = DefaultMaxQueue
	case c.maxQueue < 0:
		c.maxQueue = 0
	}
	if c.timeout == 0 {
		c.timeout = DefaultQueueTimeout
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.after == nil {
		c.after = time.After
	}
	c.drain.start = c.now()
	m, err := newMetrics(cfg.Registerer, func() float64 { return c.Stats().DrainRate })
	if err != nil {
		return nil, err
	}
	c.m = m
	return c, nil
}

// Acquire admits e, waits in the queue until it is admitted, or rejects it.
// It admits at once when fewer than MaxInFlight requests are admitted, no
// request is waiting ahead of e, and canRun reports true; nil canRun means
// always. Otherwise e waits: it is admitted when, at a release (or Wake, or
// the removal of a waiter ahead of it), it is at the head of the queue, a
// slot is free and its canRun reports true.
//
// On admission Acquire returns release, which the caller must call once the
// request is done (in a defer); further calls do nothing. Otherwise it
// returns a *Rejection wrapping ErrQueueFull, ErrQueueTimeout or ErrDeadline
// (errors.Is), or ctx.Err() if ctx ends first. If the decision and the end
// of ctx race, the decision wins.
//
// canRun is called with the controller's lock held, at arrival and at every
// admission pass while its request heads the queue: it must be fast, must not
// block and must not call the Controller.
func (c *Controller) Acquire(ctx context.Context, e Entry, canRun func() bool) (release func(), err error) {
	class := e.Class.valid()
	if ctx.Err() != nil {
		c.m.rejected[class][reasonCanceled].Inc()
		return nil, ctx.Err()
	}

	c.mu.Lock()
	now := c.now()
	q := &c.classes[class]
	ahead := -1 // waiters that would go before e, counted only when needed
	if e.Deadline > 0 {
		ahead = c.rankNew(class, e.Tenant)
		if e.PredictedTTFT+c.expectedWait(ahead, now) > e.Deadline {
			rej := c.reject(class, ErrDeadline, ahead, now)
			c.mu.Unlock()
			return nil, rej
		}
	}
	if c.queued == 0 && c.inFlight < c.maxInFlight && (canRun == nil || canRun()) {
		c.admit(class, 0)
		c.mu.Unlock()
		return c.grant(), nil
	}
	if c.queued >= c.maxQueue && !c.displace(class, now) {
		if ahead < 0 {
			ahead = c.rankNew(class, e.Tenant)
		}
		rej := c.reject(class, ErrQueueFull, ahead, now)
		c.mu.Unlock()
		return nil, rej
	}

	c.seq++
	w := &waiter{
		class:    class,
		tenant:   e.Tenant,
		cost:     max(e.Tokens, 1),
		canRun:   canRun,
		seq:      c.seq,
		enqueued: now,
		done:     make(chan struct{}),
	}
	q.push(w)
	c.queued++
	c.m.queue[class].Inc()
	c.dispatch(now)
	if w.state == admitted {
		c.mu.Unlock()
		return c.grant(), nil
	}
	timeout, why := c.timeout, ErrQueueTimeout
	if e.Deadline > 0 {
		if slack := e.Deadline - e.PredictedTTFT; slack < timeout {
			timeout, why = slack, ErrDeadline
		}
	}
	timer := c.after(timeout)
	c.mu.Unlock()

	canceled := false
	select {
	case <-w.done:
		return c.outcome(w)
	case <-ctx.Done():
		canceled = true
	case <-timer:
	}

	c.mu.Lock()
	if w.state != waiting { // decided before we got the lock
		c.mu.Unlock()
		return c.outcome(w)
	}
	now = c.now()
	ahead = c.classRank(class) + q.rankOf(w)
	c.remove(w)
	if canceled {
		c.m.rejected[class][reasonCanceled].Inc()
		err = ctx.Err()
	} else {
		err = c.reject(class, why, ahead, now)
	}
	c.dispatch(now) // w may have been the head that could not run
	c.mu.Unlock()
	return nil, err
}

// Wake re-runs admission: call it when backend capacity changed outside the
// controller (a backend became healthy or a request that never went through
// Acquire finished), so that a head waiting for canRun is admitted.
func (c *Controller) Wake() {
	c.mu.Lock()
	c.dispatch(c.now())
	c.mu.Unlock()
}

// Stats returns the controller's current state.
func (c *Controller) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Stats{InFlight: c.inFlight, DrainRate: c.drain.rate(c.now())}
	for i := range c.classes {
		s.Queued[i] = c.classes[i].len()
	}
	return s
}

// outcome is the result of a waiter decided by someone else.
func (c *Controller) outcome(w *waiter) (func(), error) {
	if w.state == admitted {
		return c.grant(), nil
	}
	return nil, w.err
}

// grant is the release handle of one admission.
type grant struct {
	c    *Controller
	done atomic.Bool
}

func (c *Controller) grant() func() {
	g := &grant{c: c}
	return g.release
}

func (g *grant) release() {
	if g.done.Swap(true) {
		return
	}
	c := g.c
	c.mu.Lock()
	now := c.now()
	c.inFlight--
	c.m.inFlight.Dec()
	c.drain.observe(now)
	c.dispatch(now)
	c.mu.Unlock()
}

// admit counts one admission; c.mu is held.
func (c *Controller) admit(class Class, wait time.Duration) {
	c.inFlight++
	c.m.inFlight.Inc()
	c.m.admitted[class].Inc()
	c.m.wait[class].Observe(wait.Seconds())
}

// dispatch admits waiters in order while slots are free and the head can
// run; c.mu is held.
func (c *Controller) dispatch(now time.Time) {
	for c.queued > 0 && c.inFlight < c.maxInFlight {
		q := c.first()
		w := q.head()
		if w.canRun != nil && !w.canRun() {
			return
		}
		q.pop()
		c.queued--
		c.m.queue[w.class].Dec()
		c.admit(w.class, now.Sub(w.enqueued))
		w.state = admitted
		close(w.done)
	}
}

// first is the highest non-empty class queue; c.queued > 0.
func (c *Controller) first() *classQueue {
	for i := range c.classes {
		if c.classes[i].len() > 0 {
			return &c.classes[i]
		}
	}
	panic("admission: queued count out of step with the queues")
}

// remove takes w out of the queue without admitting it; c.mu is held.
func (c *Controller) remove(w *waiter) {
	c.classes[w.class].remove(w)
	c.queued--
	c.m.queue[w.class].Dec()
}

// displace makes room for an arrival of class by rejecting the waiter that
// would be admitted last among those of the lowest class below it. It
// reports whether there was one; c.mu is held.
func (c *Controller) displace(class Class, now time.Time) bool {
	for k := Class(NumClasses - 1); k > class; k-- {
		q := &c.classes[k]
		if q.len() == 0 {
			continue
		}
		w := q.last()
		c.remove(w)
		w.state = rejected
		w.err = c.reject(k, ErrQueueFull, c.queued, now)
		close(w.done)
		return true
	}
	return false
}

// reject counts a rejection and returns its error; c.mu is held.
func (c *Controller) reject(class Class, why error, ahead int, now time.Time) *Rejection {
	c.m.rejected[class][reasonOf(why)].Inc()
	return &Rejection{Err: why, Class: class, RetryAfter: c.retryAfter(ahead, now)}
}

// classRank counts the waiters of classes above class; c.mu is held.
func (c *Controller) classRank(class Class) int {
	n := 0
	for k := range class {
		n += c.classes[k].len()
	}
	return n
}

// rankNew counts the waiters a new request of class and tenant would queue
// behind; c.mu is held.
func (c *Controller) rankNew(class Class, tenant string) int {
	q := &c.classes[class]
	if q.len() == 0 {
		return c.classRank(class)
	}
	return c.classRank(class) + q.rank(q.startFor(tenant))
}

// expectedWait is how long a request with ahead waiters before it would
// wait: nothing if it could be admitted at once, else the time for ahead+1
// releases at the drain rate, and nothing while the rate is unknown (no
// request is rejected on a guess). c.mu is held.
func (c *Controller) expectedWait(ahead int, now time.Time) time.Duration {
	if ahead == 0 && c.inFlight < c.maxInFlight {
		return 0
	}
	r := c.drain.rate(now)
	if r <= 0 {
		return 0
	}
	return seconds(float64(ahead+1) / r)
}

// retryAfter is when a request with ahead waiters before it should come
// back: the time for ahead+1 releases at the drain rate, or QueueTimeout
// while the rate is unknown (a waiter would have waited that long), clamped
// to [MinRetryAfter, MaxRetryAfter]. c.mu is held.
func (c *Controller) retryAfter(ahead int, now time.Time) time.Duration {
	d := c.timeout
	if r := c.drain.rate(now); r > 0 {
		d = seconds(float64(ahead+1) / r)
	}
	return min(max(d, MinRetryAfter), MaxRetryAfter)
}

// seconds converts to a Duration, saturating instead of overflowing.
func seconds(s float64) time.Duration {
	if s >= float64(math.MaxInt64)/float64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}
