// Package gctune gives the garbage collector a heap floor: while the live heap
// is small, the heap may grow to the floor before a cycle runs; once the live
// heap is large, GOGC works as usual.
//
// Why a proxy might want one: Go's collector starts a cycle when the heap has
// grown by GOGC percent over what the last cycle found live. A router's live
// heap is a few tens of megabytes (connections' buffers, the prefix index),
// while every streamed request allocates some kilobytes, so at a few hundred
// requests a second a cycle runs every few seconds. During a cycle's mark
// phase each allocating goroutine pays for marking with assists, and with few
// processors (a front pinned to one) every request arriving meanwhile waits
// behind them: execution traces showed those cycles in a front's latency
// tail. A floor makes the cycles rarer by the floor over the live heap, but
// no gain in the tail has been measured, so the commands' default is no floor
// (docs/decisions/0003-gc-heap-floor-off.md). A live heap of half the floor or more is
// collected exactly as without one: the floor never lets memory grow with the
// load. GOMEMLIMIT still bounds the heap: the runtime's limit overrides any
// goal set here.
//
// The same can be had with GOGC=off and GOMEMLIMIT, but with no way back:
// past the limit the collector then runs continuously. The floor sets GOGC
// after every cycle from the heap found live, the shape of a tuner that Uber
// described for its services.
package gctune

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync/atomic"
)

// minLive is the live heap assumed before the first cycle has measured one:
// the runtime's own minimum heap goal at GOGC=100 is 4 MiB.
const minLive = 4 << 20

// maxPercent bounds the GOGC the floor sets: a live heap of a few kilobytes
// (a test binary) would otherwise ask for a percent that overflows.
const maxPercent = 1 << 20

// Percent is the GOGC that puts the next cycle's heap goal at the larger of
// floor and live×(1+base/100): base where the live heap grown by base percent
// already passes the floor. A negative base (GOGC=off) is returned as is.
func Percent(live, floor uint64, base int) int {
	if base < 0 {
		return base
	}
	live = max(live, 1)
	if floor <= live {
		return base
	}
	// The goal is live×(1+p/100): p for a goal at the floor.
	p := float64(floor-live) * 100 / float64(live)
	switch {
	case p <= float64(base):
		return base
	case p >= maxPercent:
		return maxPercent
	}
	return int(p)
}

// Base is the GOGC the process was started with: the GOGC environment
// variable as the runtime reads it, 100 without one, -1 for "off".
func Base(getenv func(string) string) int {
	v := getenv("GOGC")
	if v == "off" {
		return -1
	}
	if n, err := strconv.Atoi(v); err == nil {
		return n
	}
	return 100
}

// Tuner keeps the floor over the process's lifetime. Start one per process.
type Tuner struct {
	floor   uint64
	base    int
	current atomic.Int64
	stopped atomic.Bool
	cycles  atomic.Int64 // cycles seen, for tests
}

// Start sets GOGC from the floor now and after every garbage-collection cycle,
// until Stop. It does nothing (and returns nil) when floor is 0 or GOGC is
// off: whoever turned the collector off has their own plan.
func Start(floor uint64) *Tuner {
	base := Base(os.Getenv)
	if floor == 0 || base < 0 {
		return nil
	}
	t := &Tuner{floor: floor, base: base}
	t.current.Store(int64(base))
	t.adjust()
	t.arm()
	return t
}

// Stop gives the process back the GOGC it started with.
func (t *Tuner) Stop() {
	if t == nil || t.stopped.Swap(true) {
		return
	}
	debug.SetGCPercent(t.base)
}

// Percent is the GOGC the tuner set last.
func (t *Tuner) Percent() int { return int(t.current.Load()) }

// arm leaves an object behind for the next cycle to find unreachable: its
// finalizer runs once that cycle has ended, which is when the heap it found
// live is known.
func (t *Tuner) arm() {
	s := new(sentinel)
	s.t = t
	runtime.SetFinalizer(s, func(s *sentinel) {
		if s.t.stopped.Load() {
			return
		}
		s.t.cycles.Add(1)
		s.t.adjust()
		s.t.arm()
	})
}

// sentinel is a pointer-holding object, so that the allocator does not
// batch it with others (tiny objects share a block, and a finalizer on one
// would wait for all of them).
type sentinel struct {
	t *Tuner
	_ [16]byte
}

// adjust sets GOGC for the heap the last cycle found live. debug.SetGCPercent
// stops the world for a moment, so it is called only when the percent moves by
// more than an eighth.
func (t *Tuner) adjust() {
	p := Percent(max(liveHeap(), minLive), t.floor, t.base)
	cur := t.current.Load()
	if d := math.Abs(float64(int64(p) - cur)); d <= float64(cur)/8 {
		return
	}
	t.current.Store(int64(p))
	debug.SetGCPercent(p)
}

// liveHeap is the heap the last cycle marked live (0 before the first).
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
