package admission

import (
	"container/heap"
	"time"
)

// waiter is one queued request. The controller's lock guards every field but
// done; state and err are written before done is closed, so the waiting
// goroutine reads them after <-done without the lock.
type waiter struct {
	class    Class
	tenant   string
	cost     int64 // tokens, at least 1
	canRun   func() bool
	seq      uint64    // arrival order, breaks ties
	start    int64     // fair-queueing start tag, in tokens of virtual time
	finish   int64     // start + cost
	index    int       // in classQueue.heap
	enqueued time.Time // for the wait histogram
	state    waiterState
	err      error // *Rejection when state is rejected
	done     chan struct{}
}

type waiterState uint8

const (
	waiting waiterState = iota
	admitted
	rejected
)

// classQueue is the waiters of one class in the order they are admitted:
// start-time fair queueing (Goyal et al., SFQ) over tenants with tokens as
// the cost. A tenant's request starts at the later of the class's virtual
// time and the finish of that tenant's previous request, and finishes cost
// tokens later; the waiter with the earliest start goes first (ties: the
// earlier arrival), and virtual time follows the start of each admitted
// waiter. So a tenant that queued 10 requests of 10k tokens has started its
// tenth at 90k while a light tenant arriving after it starts at 0, 100, 200,
// ...: backlogged tenants get equal shares of tokens, and within a tenant
// requests go first come, first served.
type classQueue struct {
	heap  waiterHeap
	vtime int64
	// tenants holds each tenant with waiters and each idle tenant whose last
	// finish is still ahead of vtime (it was served recently, so a new
	// request of its own starts there rather than at vtime).
	tenants map[string]*tenant
}

type tenant struct {
	finish int64 // finish tag of the tenant's latest request
	queued int   // its waiters in the heap
}

// idleSlack bounds idle tenants: when more than 2×waiters + idleSlack
// tenants are known, the idle ones are forgotten (those already behind
// vtime first), so many one-off tenants cost memory only while they wait.
const idleSlack = 64

func (q *classQueue) len() int { return len(q.heap) }

// startFor is the start tag a new request of tenant would get.
func (q *classQueue) startFor(name string) int64 {
	if t := q.tenants[name]; t != nil && t.finish > q.vtime {
		return t.finish
	}
	return q.vtime
}

// push tags w and queues it.
func (q *classQueue) push(w *waiter) {
	t := q.tenants[w.tenant]
	if t == nil {
		if q.tenants == nil {
			q.tenants = make(map[string]*tenant)
		}
		t = &tenant{}
		q.tenants[w.tenant] = t
	}
	w.start = max(q.vtime, t.finish)
	w.finish = w.start + w.cost
	t.finish = w.finish
	t.queued++
	heap.Push(&q.heap, w)
}

// head is the next waiter to admit; the queue must not be empty.
func (q *classQueue) head() *waiter { return q.heap[0] }

// pop takes the head off to admit it and advances virtual time.
func (q *classQueue) pop() *waiter {
	w := heap.Pop(&q.heap).(*waiter)
	q.vtime = max(q.vtime, w.start)
	q.leave(w)
	return w
}

// remove takes w off without admitting it (canceled, timed out, displaced).
// If w was its tenant's latest request, the tenant gets back the virtual
// time it had reserved.
func (q *classQueue) remove(w *waiter) {
	heap.Remove(&q.heap, w.index)
	if t := q.tenants[w.tenant]; t.finish == w.finish {
		t.finish = w.start
	}
	q.leave(w)
}

func (q *classQueue) leave(w *waiter) {
	t := q.tenants[w.tenant]
	t.queued--
	if t.queued == 0 && t.finish <= q.vtime {
		delete(q.tenants, w.tenant)
	}
	switch {
	case len(q.heap) == 0:
		// Nobody is backlogged, so nobody is owed a share: start afresh.
		clear(q.tenants)
		q.vtime = 0
	case len(q.tenants) > 2*len(q.heap)+idleSlack:
		q.forgetIdle()
	}
}

func (q *classQueue) forgetIdle() {
	for name, t := range q.tenants {
		if t.queued == 0 && t.finish <= q.vtime {
			delete(q.tenants, name)
		}
	}
	if len(q.tenants) <= 2*len(q.heap)+idleSlack {
		return
	}
	for name, t := range q.tenants {
		if t.queued == 0 {
			delete(q.tenants, name)
		}
	}
}

// last is the waiter that would be admitted last: the one a higher-class
// arrival displaces from a full queue. The queue must not be empty.
func (q *classQueue) last() *waiter {
	h := q.heap
	l := h[len(h)/2] // the maximum is a leaf
	for _, w := range h[len(h)/2+1:] {
		if less(l, w) {
			l = w
		}
	}
	return l
}

// rank counts the waiters admitted before a request with this start tag and
// a later arrival than all of them.
func (q *classQueue) rank(start int64) int {
	n := 0
	for _, w := range q.heap {
		if w.start <= start {
			n++
		}
	}
	return n
}

// rankOf counts the waiters admitted before w.
func (q *classQueue) rankOf(w *waiter) int {
	n := 0
	for _, x := range q.heap {
		if less(x, w) {
			n++
		}
	}
	return n
}

func less(a, b *waiter) bool {
	if a.start != b.start {
		return a.start < b.start
	}
	return a.seq < b.seq
}

// waiterHeap orders waiters by (start, seq) for container/heap.
type waiterHeap []*waiter

func (h waiterHeap) Len() int           { return len(h) }
func (h waiterHeap) Less(i, j int) bool { return less(h[i], h[j]) }
func (h waiterHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *waiterHeap) Push(x any) {
	w := x.(*waiter)
	w.index = len(*h)
	*h = append(*h, w)
}

func (h *waiterHeap) Pop() any {
	old := *h
	n := len(old) - 1
	w := old[n]
	old[n] = nil // no reference left behind in the backing array
	*h = old[:n]
	w.index = -1
	return w
}
