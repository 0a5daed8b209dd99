package admission

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestNewDefaults(t *testing.T) {
	tests := []struct {
		name                string
		cfg                 Config
		wantInFlight, wantQ int
		wantTimeout         time.Duration
		wantErr             bool
	}{
		{name: "zero", wantInFlight: DefaultMaxInFlight, wantQ: DefaultMaxQueue, wantTimeout: DefaultQueueTimeout},
		{name: "set", cfg: Config{MaxInFlight: 7, MaxQueue: 3, QueueTimeout: time.Second}, wantInFlight: 7, wantQ: 3, wantTimeout: time.Second},
		{name: "no cap, no queue", cfg: Config{MaxInFlight: -1, MaxQueue: -1}, wantInFlight: int(^uint(0) >> 1), wantQ: 0, wantTimeout: DefaultQueueTimeout},
		{name: "negative timeout", cfg: Config{QueueTimeout: -time.Second}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.cfg)
			if (err != nil) != tt.wantErr {
				t.Fatalf("New: err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if c.maxInFlight != tt.wantInFlight || c.maxQueue != tt.wantQ || c.timeout != tt.wantTimeout {
				t.Errorf("got MaxInFlight %d, MaxQueue %d, QueueTimeout %v; want %d, %d, %v",
					c.maxInFlight, c.maxQueue, c.timeout, tt.wantInFlight, tt.wantQ, tt.wantTimeout)
			}
		})
	}
}

func TestAdmitUnderCap(t *testing.T) {
	h := newHarness(t, Config{MaxInFlight: 3})
	var releases []func()
	for i := range 3 {
		releases = append(releases, h.admitNow(Entry{Tenant: fmt.Sprint(i)}))
	}
	if s := h.c.Stats(); s.InFlight != 3 || total(s) != 0 {
		t.Errorf("stats %+v, want 3 in flight, none queued", s)
	}
	if got := value(t, h.c.m.inFlight); got != 3 {
		t.Errorf("in-flight gauge %v, want 3", got)
	}
	for _, r := range releases {
		r()
	}
	if s := h.c.Stats(); s.InFlight != 0 {
		t.Errorf("in flight %d after releases, want 0", s.InFlight)
	}
}

func TestQueueAdmitsInOrder(t *testing.T) {
	h := newHarness(t, Config{MaxInFlight: 1})
	hold := h.admitNow(Entry{})
	ctx := context.Background()
	for _, name := range []string{"a", "b", "c"} {
		h.queue(ctx, name, Entry{Tenant: "t", Tokens: 100}, nil)
	}
	if s := h.c.Stats(); s.Queued[Critical] != 3 {
		t.Fatalf("queued %v, want 3 critical (the zero Class)", s.Queued)
	}
	h.clock.Advance(5 * time.Second)
	hold()
	for _, want := range []string{"a", "b", "c"} {
		r := h.next()
		if r.err != nil || r.name != want {
			t.Fatalf("admitted %q (err %v), want %q", r.name, r.err, want)
		}
		if s := h.c.Stats(); s.InFlight != 1 {
			t.Errorf("in flight %d, want 1", s.InFlight)
		}
		r.release()
	}
	checkEmpty(t, h.c)
	if got := value(t, h.c.m.admitted[Critical]); got != 4 {
		t.Errorf("admitted %v, want 4", got)
	}
}

func TestClassPriority(t *testing.T) {
	tests := []struct {
		name    string
		arrive  []Entry
		wantOrd []int // indexes into arrive
	}{
		{
			name:    "higher first",
			arrive:  []Entry{{Class: Sheddable}, {Class: Standard}, {Class: Critical}, {Class: Standard}},
			wantOrd: []int{2, 1, 3, 0},
		},
		{
			name: "class beats fairness",
			arrive: []Entry{
				{Class: Standard, Tenant: "light", Tokens: 1},
				{Class: Critical, Tenant: "heavy", Tokens: 1e6},
				{Class: Critical, Tenant: "heavy", Tokens: 1e6},
			},
			wantOrd: []int{1, 2, 0},
		},
		{
			name:    "out of range is sheddable",
			arrive:  []Entry{{Class: 200}, {Class: Sheddable}, {Class: Standard}},
			wantOrd: []int{2, 0, 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Config{MaxInFlight: 1})
			hold := h.admitNow(Entry{})
			for i, e := range tt.arrive {
				h.queue(context.Background(), fmt.Sprint(i), e, nil)
			}
			hold()
			for _, want := range tt.wantOrd {
				r := h.next()
				if r.err != nil || r.name != fmt.Sprint(want) {
					t.Fatalf("admitted %s (err %v), want %d", r.name, r.err, want)
				}
				r.release()
			}
			checkEmpty(t, h.c)
		})
	}
}

func TestTokenFairness(t *testing.T) {
	h := newHarness(t, Config{MaxInFlight: 1})
	hold := h.admitNow(Entry{})
	for i := range 10 {
		h.queue(context.Background(), fmt.Sprint("heavy", i), Entry{Tenant: "heavy", Tokens: 10_000}, nil)
	}
	for i := range 10 {
		h.queue(context.Background(), fmt.Sprint("light", i), Entry{Tenant: "light", Tokens: 100}, nil)
	}
	hold()
	var order []string
	for range 20 {
		r := h.next()
		if r.err != nil {
			t.Fatal(r.err)
		}
		order = append(order, r.name)
		r.release()
	}
	// The heavy tenant's first request started at the same virtual time as
	// the light one's and arrived first; then the light tenant has 10×100
	// tokens to go before the heavy one's second (which starts at 10k).
	want := []string{"heavy0"}
	for i := range 10 {
		want = append(want, fmt.Sprint("light", i))
	}
	for i := 1; i < 10; i++ {
		want = append(want, fmt.Sprint("heavy", i))
	}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("order\n%v\nwant\n%v", order, want)
	}
	checkEmpty(t, h.c)
}

func TestFairnessRemembersRecentService(t *testing.T) {
	// A tenant that keeps one request queued at a time still pays for the
	// tokens it was just served: its next request starts where the last one
	// finished, not at the class's virtual time.
	h := newHarness(t, Config{MaxInFlight: 1})
	hold := h.admitNow(Entry{})
	h.queue(context.Background(), "heavy0", Entry{Tenant: "heavy", Tokens: 1000}, nil)
	for i := range 20 {
		h.queue(context.Background(), fmt.Sprint("light", i), Entry{Tenant: "light", Tokens: 100}, nil)
	}
	hold()
	r := h.next()
	if r.name != "heavy0" {
		t.Fatalf("first %s, want heavy0", r.name)
	}
	h.queue(context.Background(), "heavy1", Entry{Tenant: "heavy", Tokens: 1000}, nil)
	r.release()
	var lights int
	for {
		r := h.next()
		r.release()
		if r.name == "heavy1" {
			break
		}
		lights++
	}
	// heavy1 starts at 1000, where heavy0 finished; the light requests
	// start at 0, 100, ..., 1000, and the last of them arrived first.
	if lights != 11 {
		t.Errorf("%d light requests before heavy1, want 11 (1000 tokens' worth and a tie)", lights)
	}
}

func TestQueueFull(t *testing.T) {
	t.Run("rate unknown", func(t *testing.T) {
		h := newHarness(t, Config{MaxInFlight: 1, MaxQueue: 2})
		hold := h.admitNow(Entry{})
		h.queue(context.Background(), "a", Entry{}, nil)
		h.queue(context.Background(), "b", Entry{}, nil)
		_, err := h.c.Acquire(context.Background(), Entry{}, nil)
		var rej *Rejection
		if !errors.Is(err, ErrQueueFull) || !errors.As(err, &rej) {
			t.Fatalf("err = %v, want a *Rejection of ErrQueueFull", err)
		}
		if rej.RetryAfter != DefaultQueueTimeout {
			t.Errorf("RetryAfter %v with no drain rate, want QueueTimeout %v", rej.RetryAfter, DefaultQueueTimeout)
		}
		if got := value(t, h.c.m.rejected[Critical][reasonQueueFull]); got != 1 {
			t.Errorf("rejected{queue_full} = %v, want 1", got)
		}
		hold()
		for range 2 {
			h.next().release()
		}
		checkEmpty(t, h.c)
	})
	tests := []struct {
		name           string
		rate           float64 // releases per second before the queue fills
		maxQueue       int
		wantRetryAfter time.Duration // ± 10 %
	}{
		{name: "estimated", rate: 10, maxQueue: 49, wantRetryAfter: 5 * time.Second}, // (49+1)/10
		{name: "clamped low", rate: 100, maxQueue: 9, wantRetryAfter: MinRetryAfter},
		{name: "clamped high", rate: 1, maxQueue: 99, wantRetryAfter: MaxRetryAfter},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Config{MaxInFlight: 1, MaxQueue: tt.maxQueue})
			h.establishRate(tt.rate, int(60*tt.rate))
			hold := h.admitNow(Entry{})
			for i := range tt.maxQueue {
				h.queue(context.Background(), fmt.Sprint(i), Entry{}, nil)
			}
			_, err := h.c.Acquire(context.Background(), Entry{}, nil)
			ra, ok := RetryAfter(err)
			if !errors.Is(err, ErrQueueFull) || !ok {
				t.Fatalf("err = %v, want ErrQueueFull", err)
			}
			if ra < MinRetryAfter || ra > MaxRetryAfter {
				t.Errorf("RetryAfter %v outside [%v, %v]", ra, MinRetryAfter, MaxRetryAfter)
			}
			if lo, hi := tt.wantRetryAfter*9/10, tt.wantRetryAfter*11/10; ra < lo || ra > hi {
				t.Errorf("RetryAfter %v, want about %v", ra, tt.wantRetryAfter)
			}
			hold()
			for range tt.maxQueue {
				h.next().release()
			}
			checkEmpty(t, h.c)
		})
	}
}

func TestDisplacement(t *testing.T) {
	h := newHarness(t, Config{MaxInFlight: 1, MaxQueue: 2})
	hold := h.admitNow(Entry{})
	h.queue(context.Background(), "shed1", Entry{Class: Sheddable}, nil)
	h.queue(context.Background(), "shed2", Entry{Class: Sheddable}, nil)

	// A critical arrival displaces the sheddable waiter that would go last.
	h.queue(context.Background(), "crit", Entry{Class: Critical}, nil)
	if r := h.next(); r.name != "shed2" || !errors.Is(r.err, ErrQueueFull) {
		t.Fatalf("%s: %v, want shed2 displaced with ErrQueueFull", r.name, r.err)
	}
	// So does a standard one, of the remaining sheddable.
	h.queue(context.Background(), "std", Entry{Class: Standard}, nil)
	if r := h.next(); r.name != "shed1" || !errors.Is(r.err, ErrQueueFull) {
		t.Fatalf("%s: %v, want shed1 displaced with ErrQueueFull", r.name, r.err)
	}
	// Nothing below standard is left: a standard or sheddable arrival is
	// rejected itself.
	for _, class := range []Class{Standard, Sheddable} {
		if _, err := h.c.Acquire(context.Background(), Entry{Class: class}, nil); !errors.Is(err, ErrQueueFull) {
			t.Errorf("%v arrival: err = %v, want ErrQueueFull", class, err)
		}
	}
	if got := value(t, h.c.m.rejected[Sheddable][reasonQueueFull]); got != 3 {
		t.Errorf("rejected{sheddable,queue_full} = %v, want 3", got)
	}
	hold()
	for _, want := range []string{"crit", "std"} {
		r := h.next()
		if r.name != want || r.err != nil {
			t.Fatalf("%s (%v), want %s admitted", r.name, r.err, want)
		}
		r.release()
	}
	checkEmpty(t, h.c)
}

func TestQueueTimeout(t *testing.T) {
	h := newHarness(t, Config{MaxInFlight: 1, QueueTimeout: 10 * time.Second})
	hold := h.admitNow(Entry{})
	h.queue(context.Background(), "a", Entry{}, nil)
	h.clock.Advance(5 * time.Second)
	h.queue(context.Background(), "b", Entry{}, nil)
	h.clock.Advance(5 * time.Second) // a's timer is due, b's not
	r := h.next()
	var rej *Rejection
	if r.name != "a" || !errors.Is(r.err, ErrQueueTimeout) || !errors.As(r.err, &rej) {
		t.Fatalf("%s: %v, want a to time out", r.name, r.err)
	}
	if rej.RetryAfter < MinRetryAfter || rej.RetryAfter > MaxRetryAfter {
		t.Errorf("RetryAfter %v outside [1 s, 60 s]", rej.RetryAfter)
	}
	if s := h.c.Stats(); s.Queued[Critical] != 1 {
		t.Errorf("queued %v, want b alone", s.Queued)
	}
	hold()
	if r := h.next(); r.name != "b" || r.err != nil {
		t.Fatalf("%s: %v, want b admitted", r.name, r.err)
	} else {
		r.release()
	}
	if got := value(t, h.c.m.rejected[Critical][reasonQueueTimeout]); got != 1 {
		t.Errorf("rejected{queue_timeout} = %v, want 1", got)
	}
	checkEmpty(t, h.c)
}

func TestCancelRemovesWaiter(t *testing.T) {
	h := newHarness(t, Config{MaxInFlight: 2})
	hold := h.admitNow(Entry{})
	// a heads the queue and cannot run; b waits behind it.
	ctx, cancel := context.WithCancel(context.Background())
	h.queue(ctx, "a", Entry{}, func() bool { return false })
	h.queue(context.Background(), "b", Entry{}, nil)
	cancel()
	// Removing a re-ran admission: b had a free slot. The two goroutines
	// report in either order.
	var b result
	for range 2 {
		switch r := h.next(); r.name {
		case "a":
			if !errors.Is(r.err, context.Canceled) {
				t.Fatalf("a: %v, want canceled", r.err)
			}
		case "b":
			if r.err != nil {
				t.Fatalf("b: %v, want admitted", r.err)
			}
			b = r
		}
	}
	if got := value(t, h.c.m.rejected[Critical][reasonCanceled]); got != 1 {
		t.Errorf("rejected{canceled} = %v, want 1", got)
	}
	b.release()
	hold()
	checkEmpty(t, h.c)

	// A context already done is turned away without queueing.
	if _, err := h.c.Acquire(ctx, Entry{}, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("done ctx: err = %v, want context.Canceled", err)
	}
}

func TestCanRunHoldsHead(t *testing.T) {
	h := newHarness(t, Config{MaxInFlight: 2})
	var free atomic.Bool
	calls := atomic.Int32{}
	canRun := func() bool { calls.Add(1); return free.Load() }
	other1, other2 := h.admitNow(Entry{}), h.admitNow(Entry{})
	h.queue(context.Background(), "a", Entry{}, canRun)
	h.queue(context.Background(), "b", Entry{}, nil) // could run, but a is ahead

	other1() // a slot frees up, but a's backends are still saturated
	h.c.Wake()
	if s := h.c.Stats(); s.InFlight != 1 || s.Queued[Critical] != 2 {
		t.Fatalf("a blocked: %+v, want 1 in flight and both waiting", s)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("canRun called %d times, want 2: at the release and at Wake (at arrival the cap was reached)", n)
	}
	free.Store(true)
	other2() // the next release re-runs admission and finds a runnable
	got := map[string]bool{}
	for range 2 {
		r := h.next()
		if r.err != nil {
			t.Fatalf("%s: %v", r.name, r.err)
		}
		got[r.name] = true
		r.release()
	}
	if !got["a"] || !got["b"] {
		t.Errorf("admitted %v, want a and b", got)
	}
	checkEmpty(t, h.c)
}

func TestReleaseIdempotent(t *testing.T) {
	h := newHarness(t, Config{MaxInFlight: 2})
	a := h.admitNow(Entry{})
	b := h.admitNow(Entry{})
	a()
	a()
	a()
	if s := h.c.Stats(); s.InFlight != 1 {
		t.Fatalf("in flight %d after releasing a thrice, want 1", s.InFlight)
	}
	b()
	b()
	if s := h.c.Stats(); s.InFlight != 0 {
		t.Fatalf("in flight %d, want 0", s.InFlight)
	}
	if got := value(t, h.c.m.inFlight); got != 0 {
		t.Errorf("in-flight gauge %v, want 0", got)
	}
}

func TestDeadline(t *testing.T) {
	tests := []struct {
		name    string
		rate    float64 // releases per second established first; 0: none
		queued  int     // waiters ahead
		entry   Entry
		wantErr error // nil: admitted at once or queued
	}{
		{name: "no deadline", queued: 50, entry: Entry{Class: Standard, Tenant: "other", PredictedTTFT: time.Hour}},
		{name: "meetable now", entry: Entry{Deadline: 2 * time.Second, PredictedTTFT: time.Second}},
		{name: "unmeetable now", entry: Entry{Deadline: time.Second, PredictedTTFT: 2 * time.Second}, wantErr: ErrDeadline},
		// 50 ahead at 10/s: 5.1 s of queue + 1 s of TTFT.
		{name: "queue makes it unmeetable", rate: 10, queued: 50, entry: Entry{Class: Standard, Tenant: "other", Deadline: 6 * time.Second, PredictedTTFT: time.Second}, wantErr: ErrDeadline},
		{name: "queue leaves room", rate: 10, queued: 50, entry: Entry{Class: Standard, Tenant: "other", Deadline: 7 * time.Second, PredictedTTFT: time.Second}},
		{name: "rate unknown: no guess", queued: 50, entry: Entry{Class: Standard, Tenant: "other", Deadline: 2 * time.Second, PredictedTTFT: time.Second}},
		// Fair queueing puts a new tenant's first request at the front.
		{name: "a new tenant goes first", rate: 10, queued: 50, entry: Entry{Class: Standard, Tenant: "new", Deadline: 2 * time.Second, PredictedTTFT: time.Second}},
		{name: "a higher class jumps the queue", rate: 10, queued: 50, entry: Entry{Class: Critical, Tenant: "other", Deadline: 2 * time.Second, PredictedTTFT: time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Config{MaxInFlight: 1})
			if tt.rate > 0 {
				h.establishRate(tt.rate, int(60*tt.rate))
			}
			var hold func()
			if tt.queued > 0 {
				hold = h.admitNow(Entry{})
				for i := range tt.queued {
					h.queue(context.Background(), fmt.Sprint(i), Entry{Class: Standard, Tenant: "other"}, nil)
				}
			}
			h.queue(context.Background(), "x", tt.entry, nil)
			if tt.wantErr != nil {
				r := h.next()
				if r.name != "x" || !errors.Is(r.err, tt.wantErr) {
					t.Fatalf("%s: %v, want x rejected with %v", r.name, r.err, tt.wantErr)
				}
				if _, ok := RetryAfter(r.err); !ok {
					t.Errorf("%v carries no RetryAfter", r.err)
				}
				if got := value(t, h.c.m.rejected[tt.entry.Class][reasonDeadline]); got != 1 {
					t.Errorf("rejected{deadline} = %v, want 1", got)
				}
			}
			if hold != nil {
				hold()
			}
			n := tt.queued
			if tt.wantErr == nil {
				n++
			}
			for range n {
				r := h.next()
				if r.err != nil {
					t.Fatalf("%s: %v", r.name, r.err)
				}
				r.release()
			}
			checkEmpty(t, h.c)
		})
	}
}

func TestDeadlineExpiresInQueue(t *testing.T) {
	h := newHarness(t, Config{MaxInFlight: 1})
	hold := h.admitNow(Entry{})
	// 3 s of deadline, 1 s of TTFT: 2 s of slack to wait in, not QueueTimeout.
	h.queue(context.Background(), "x", Entry{Deadline: 3 * time.Second, PredictedTTFT: time.Second}, nil)
	h.clock.Advance(time.Second)
	if s := h.c.Stats(); s.Queued[Critical] != 1 {
		t.Fatalf("queued %v after 1 s, want x still waiting", s.Queued)
	}
	h.clock.Advance(time.Second)
	if r := h.next(); !errors.Is(r.err, ErrDeadline) {
		t.Fatalf("err = %v, want ErrDeadline once the slack is spent", r.err)
	}
	hold()
	checkEmpty(t, h.c)
}

func TestBoundedMemory(t *testing.T) {
	t.Run("rejected at arrival", func(t *testing.T) {
		const n = 100_000
		h := newHarness(t, Config{MaxInFlight: 1, MaxQueue: 4})
		hold := h.admitNow(Entry{})
		for i := range 4 {
			h.queue(context.Background(), fmt.Sprint(i), Entry{Class: Critical, Tenant: fmt.Sprint("q", i)}, nil)
		}
		for i := range n {
			e := Entry{Class: Class(i % NumClasses), Tenant: fmt.Sprint("t", i), Tokens: int64(i)}
			if i%2 == 1 {
				e.Deadline, e.PredictedTTFT = time.Second, 2*time.Second
			}
			if _, err := h.c.Acquire(context.Background(), e, nil); err == nil {
				t.Fatalf("entry %d admitted, want rejected", i)
			}
		}
		hold()
		for range 4 {
			h.next().release()
		}
		checkEmpty(t, h.c)
	})
	t.Run("rejected from the queue", func(t *testing.T) {
		const n = 3000
		h := newHarness(t, Config{MaxInFlight: 1, MaxQueue: 1, QueueTimeout: time.Second})
		hold := h.admitNow(Entry{})
		for i := range n {
			tenant := fmt.Sprint("t", i)
			ctx, cancel := context.WithCancel(context.Background())
			var want error
			switch i % 3 {
			case 0:
				h.queue(ctx, "x", Entry{Tenant: tenant}, nil)
				cancel()
				want = context.Canceled
			case 1:
				h.queue(ctx, "x", Entry{Tenant: tenant}, nil)
				h.clock.Advance(time.Second)
				want = ErrQueueTimeout
			case 2:
				h.queue(context.Background(), "x", Entry{Class: Sheddable, Tenant: tenant}, nil)
				h.queue(ctx, "y", Entry{Class: Critical, Tenant: tenant + "y"}, nil) // displaces x
				if r := h.next(); r.name != "x" || !errors.Is(r.err, ErrQueueFull) {
					t.Fatalf("%s: %v, want x displaced", r.name, r.err)
				}
				cancel()
				want = context.Canceled
			}
			if r := h.next(); !errors.Is(r.err, want) {
				t.Fatalf("round %d: %s: %v, want %v", i, r.name, r.err, want)
			}
			cancel()
		}
		hold()
		checkEmpty(t, h.c)
	})
}

func TestConcurrent(t *testing.T) {
	const (
		workers = 64
		each    = 200
		maxIn   = 4
	)
	c, err := New(Config{MaxInFlight: maxIn, MaxQueue: 48, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	var inFlight, peak, admitted, rejected atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range each {
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(8) == 0 {
					cancel() // some give up at once, some while waiting
				} else if rng.IntN(8) == 0 {
					go cancel()
				}
				e := Entry{Class: Class(rng.IntN(NumClasses)), Tenant: fmt.Sprint(rng.IntN(5)), Tokens: int64(rng.IntN(10_000))}
				release, err := c.Acquire(ctx, e, func() bool { return rand.IntN(4) != 0 }) // called from other goroutines: the global source
				cancel()
				if err != nil {
					rejected.Add(1)
					continue
				}
				admitted.Add(1)
				if n := inFlight.Add(1); n > maxIn {
					t.Errorf("%d in flight, cap %d", n, maxIn)
				} else {
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
				}
				for range 1 + rng.IntN(4) { // hold the slot a while
					runtime.Gosched()
				}
				inFlight.Add(-1)
				release()
				release()
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for {
		select {
		case <-done:
			s := c.Stats()
			if s.InFlight != 0 || total(s) != 0 {
				t.Errorf("left %+v", s)
			}
			checkEmpty(t, c)
			if admitted.Load()+rejected.Load() != workers*each {
				t.Errorf("admitted %d + rejected %d != %d", admitted.Load(), rejected.Load(), workers*each)
			}
			t.Logf("admitted %d, rejected %d, peak %d", admitted.Load(), rejected.Load(), peak.Load())
			return
		default:
			// A head whose canRun said no waits for the next release; at
			// the end there is none. Wake stands in for backend capacity
			// freeing outside the controller.
			c.Wake()
			runtime.Gosched()
		}
	}
}
