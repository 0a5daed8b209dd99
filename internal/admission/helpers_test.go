package admission

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// clock is a fake clock: Now stands still until Advance, which fires the
// timers After handed out that are due.
type clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []timer
}

type timer struct {
	at time.Time
	ch chan time.Time
}

func newClock() *clock { return &clock{now: time.Unix(1_000_000, 0)} }

func (k *clock) Now() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.now
}

func (k *clock) After(d time.Duration) <-chan time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- k.now
		return ch
	}
	k.timers = append(k.timers, timer{k.now.Add(d), ch})
	return ch
}

func (k *clock) Advance(d time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.now = k.now.Add(d)
	keep := k.timers[:0]
	for _, t := range k.timers {
		if t.at.After(k.now) {
			keep = append(keep, t)
		} else {
			t.ch <- k.now
		}
	}
	k.timers = keep
}

// result is what one Acquire returned.
type result struct {
	name    string
	release func()
	err     error
}

// harness drives a Controller on a fake clock; Acquires that may wait run in
// goroutines that report on results.
type harness struct {
	t       *testing.T
	c       *Controller
	clock   *clock
	results chan result
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	k := newClock()
	cfg.Now, cfg.After = k.Now, k.After
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, c: c, clock: k, results: make(chan result, 1024)}
}

// admitNow acquires e, which must be admitted at once.
func (h *harness) admitNow(e Entry) func() {
	h.t.Helper()
	if s := h.c.Stats(); s.InFlight >= h.c.maxInFlight || total(s) > 0 {
		h.t.Fatalf("admitNow would wait: %+v", s)
	}
	release, err := h.c.Acquire(context.Background(), e, nil)
	if err != nil {
		h.t.Fatalf("Acquire(%+v) = %v, want admitted", e, err)
	}
	return release
}

// queue starts an Acquire of e named name and returns once it has joined the
// queue (or been decided at once).
func (h *harness) queue(ctx context.Context, name string, e Entry, canRun func() bool) {
	h.t.Helper()
	h.c.mu.Lock()
	before := h.c.seq
	h.c.mu.Unlock()
	var returned atomic.Bool
	go func() {
		release, err := h.c.Acquire(ctx, e, canRun)
		returned.Store(true)
		h.results <- result{name, release, err}
	}()
	waitUntil(h.t, "queued "+name, func() bool {
		h.c.mu.Lock()
		defer h.c.mu.Unlock()
		return h.c.seq > before || returned.Load()
	})
}

// next is the next Acquire to return.
func (h *harness) next() result {
	h.t.Helper()
	select {
	case r := <-h.results:
		return r
	case <-time.After(10 * time.Second): // a failure bound, not a wait for state
		h.t.Fatal("no Acquire returned")
		return result{}
	}
}

// establishRate releases n requests, one every 1/perSecond, so that the
// drain rate reads perSecond. The queue must be empty.
func (h *harness) establishRate(perSecond float64, n int) {
	h.t.Helper()
	step := time.Duration(float64(time.Second) / perSecond)
	for range n {
		release := h.admitNow(Entry{})
		h.clock.Advance(step)
		release()
	}
}

// waitUntil polls cond, yielding between polls; the wall clock only bounds
// a failure.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		runtime.Gosched()
	}
}

func total(s Stats) int {
	n := 0
	for _, q := range s.Queued {
		n += q
	}
	return n
}

// checkEmpty asserts that nothing is queued and no state is left behind.
func checkEmpty(t *testing.T, c *Controller) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.queued != 0 {
		t.Errorf("queued = %d, want 0", c.queued)
	}
	for i := range c.classes {
		q := &c.classes[i]
		if len(q.heap) != 0 || len(q.tenants) != 0 || q.vtime != 0 {
			t.Errorf("class %d: %d waiters, %d tenants, vtime %d left behind", i, len(q.heap), len(q.tenants), q.vtime)
		}
		for _, w := range q.heap[:cap(q.heap)] {
			if w != nil {
				t.Errorf("class %d: a popped waiter is still referenced", i)
			}
		}
	}
}

// value reads a gauge's or a counter's value.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	case d.Counter != nil:
		return d.Counter.GetValue()
	}
	t.Fatalf("%v is neither a gauge nor a counter", m.Desc())
	return 0
}
