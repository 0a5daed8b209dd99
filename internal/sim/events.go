package sim

import "time"

// kind is what an event does when its time comes.
type kind uint8

const (
	// evSession starts the next session of an open-loop workload (sessions
	// are fed one at a time, in start order, so the queue stays small).
	evSession kind = iota
	// evSend sends the next turn of session idx.
	evSend
	// evStepStart starts a step on idle server idx. It is queued rather than
	// run at once so that every request arriving at the same instant joins
	// the step.
	evStepStart
	// evStepEnd ends the step (or the run of steps) in flight on server
	// idx and starts the next. A run cut short leaves its event queued;
	// the server knows which event ends what it has in flight.
	evStepEnd
	// evScrape refreshes router replica idx's copy of the servers' metrics.
	evScrape
	// evSample records every server's load.
	evSample
	// evGossip shares the replicas' in-flight counts (Config.Gossip).
	evGossip
	// evKVEvents delivers server idx's KV events that have arrived to the
	// routers (Config.KVEvents).
	evKVEvents
	// evPush delivers the oldest replica count change in flight to the
	// other replicas (Config.GossipPush).
	evPush
	// evTransferred queues flight idx on its decode server, its KV moved
	// from the prefill server (disagg.go).
	evTransferred
)

// event is one thing to happen at a moment of virtual time. Events at the
// same moment happen in the order they were queued (seq), which makes a run
// deterministic; except that steps of different servers ending at the same
// moment end in server order: when they were queued depends on whether the
// servers stepped or coasted, and the order in which their requests finish
// is what a learning policy learns in (tiled traces, whose copies run in
// lockstep, end steps at the same moment all the time).
type event struct {
	at   time.Duration
	seq  uint64
	idx  int32
	kind kind
}

func (a *event) before(b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	if a.kind == evStepEnd && b.kind == evStepEnd && a.idx != b.idx {
		return a.idx < b.idx
	}
	return a.seq < b.seq
}

// queue is a 4-ary min-heap of events by (at, seq): shallower than a binary
// heap, and its children share cache lines. It holds values, not pointers,
// so pushing and popping never allocates once it has grown.
type queue struct {
	ev  []event
	seq uint64
}

func (q *queue) len() int { return len(q.ev) }

// push queues an event and returns its sequence number, which names it.
func (q *queue) push(at time.Duration, k kind, idx int32) uint64 {
	q.seq++
	q.ev = append(q.ev, event{at: at, seq: q.seq, idx: idx, kind: k})
	i := len(q.ev) - 1
	e := q.ev[i]
	for i > 0 {
		p := (i - 1) / 4
		if !e.before(&q.ev[p]) {
			break
		}
		q.ev[i] = q.ev[p]
		i = p
	}
	q.ev[i] = e
	return e.seq
}

// pop removes and returns the earliest event. The queue must not be empty.
func (q *queue) pop() event {
	top := q.ev[0]
	last := len(q.ev) - 1
	e := q.ev[last]
	q.ev = q.ev[:last]
	if last == 0 {
		return top
	}
	i := 0
	for {
		c := 4*i + 1
		if c >= last {
			break
		}
		best := c
		for j := c + 1; j < min(c+4, last); j++ {
			if q.ev[j].before(&q.ev[best]) {
				best = j
			}
		}
		if !q.ev[best].before(&e) {
			break
		}
		q.ev[i] = q.ev[best]
		i = best
	}
	q.ev[i] = e
	return top
}
