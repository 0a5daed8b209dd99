// Package engine models one inference server (vLLM's V1 engine by default):
// continuous batching, chunked prefill, a paged KV cache with prefix caching
// and LRU eviction, and a roofline step time. It keeps no clock of its own:
// the emulator drives it in real time, the simulator in virtual time, so
// both serve the same model (docs/engine-model.md).
package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/internal/hashtab"
)

// Errors returned by Add.
var (
	// ErrInvalid means a request's lengths make no sense.
	ErrInvalid = errors.New("invalid request")
	// ErrTooLong means a request's prompt plus output exceeds the model's
	// context or the whole KV cache.
	ErrTooLong = errors.New("request longer than the model's context")
)

// Engine models one vLLM-like inference server: an FCFS waiting queue,
// continuous batching with chunked prefill (decodes first), a paged KV cache
// with prefix caching, LRU eviction and preemption by recompute, and a
// roofline step-time model. It has no clock of its own: the caller passes the
// current time to every call and advances time by the duration of each step,
// so the same model runs in real time (the emulator) and in virtual time (the
// simulator). An Engine is not safe for concurrent use.
type Engine struct {
	p       Profile
	rf      roofline
	kv      *kvCache
	waiting queue
	// pending are requests still in Profile.RequestOverhead, in order of
	// arrival (and so of readiness: the overhead is one constant).
	pending queue
	running []*Request
	// slots are the llama.cpp-like slots when Profile.Slots is set, else
	// nil (slots.go).
	slots *slotTable
	// Per-step scratch, reused to keep Step free of allocations.
	sched  []*Request
	tokens []*Request
	stats  Stats
	co     coast // the run of decode steps in flight, if any (coast.go)
	// observer hears of every block published and evicted (SetObserver).
	observer BlockObserver
	// lora is the adapters' state when LoRA is on (SetLoRA), else nil.
	lora *loraState
}

// BlockObserver hears what an engine's prefix cache stores and evicts: what
// vLLM publishes as KV events (BlockStored, BlockRemoved). Its methods run
// inside the engine's calls and must not call back into the engine.
type BlockObserver interface {
	// Stored says that block i of r (r.BlockHashes[i], whose parent is
	// r.BlockHashes[i-1], none for i == 0) is now findable in the cache.
	Stored(r *Request, i int)
	// Evicted says that the block published under hash has left the cache.
	Evicted(hash uint64)
}

// SetObserver makes o hear of every block the cache stores and evicts from
// now on; nil stops it. Blocks already cached are not reported.
func (e *Engine) SetObserver(o BlockObserver) {
	e.observer = o
	e.kv.evicted = nil
	if o != nil {
		e.kv.evicted = o.Evicted
	}
}

// Stats are an engine's counters. Token counts are in tokens.
type Stats struct {
	// Running and Waiting are the current queue lengths.
	Running, Waiting int
	// Pending counts requests added but still in Profile.RequestOverhead:
	// like a request vLLM is still tokenizing, they are neither running nor
	// waiting.
	Pending int
	// UsedBlocks is the number of KV blocks held by requests; TotalBlocks the
	// capacity. Cached blocks no request holds are free, not used.
	UsedBlocks, TotalBlocks int
	// KVUsage is UsedBlocks/TotalBlocks, in [0, 1].
	KVUsage float64
	// PrefixQueries and PrefixHits count prompt tokens looked up in, and found
	// in, the prefix cache when requests were first scheduled.
	PrefixQueries, PrefixHits int64
	// PromptTokens and GenerationTokens count tokens of finished prefills and
	// generated tokens.
	PromptTokens, GenerationTokens int64
	// Preemptions counts requests that lost their KV blocks.
	Preemptions int64
	// EvictedBlocks counts cached blocks evicted to make room.
	EvictedBlocks int64
	// Finished and Aborted count requests that ended.
	Finished, Aborted int64
	// LoRALoads counts adapters loaded from storage; LoRAActivations
	// adapters put in a GPU slot (from storage or the CPU cache).
	LoRALoads, LoRAActivations int64
	// Steps counts non-empty steps; BusyTime sums their durations.
	Steps    int64
	BusyTime time.Duration
}

// StepResult says what one step did.
type StepResult struct {
	// Start and End bound the step in the engine's clock.
	Start, End time.Duration
	// Tokens lists the requests that produced one output token each, at End;
	// those with State == StateFinished have produced their last. The slice is
	// reused by the next call to Step.
	Tokens []*Request
	// PrefillTokens and DecodeTokens are the tokens computed in the step.
	PrefillTokens, DecodeTokens int
	// Preempted is the number of requests preempted in the step.
	Preempted int
	// ComputeTime and MemoryTime are the roofline's two terms for the
	// step (Profile.StepTime): how long its FLOPs and its bytes take at the
	// rates reached, before overheads. Zero when nothing was computed.
	ComputeTime, MemoryTime time.Duration
}

// New returns an idle engine for profile p with an empty cache.
func New(p Profile) (*Engine, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{p: p, rf: p.roofline(), kv: newKVCache(p.Blocks(), p.BlockSize)}
	if p.Slots > 0 {
		e.slots = newSlotTable(p.Slots)
	}
	return e, nil
}

// Profile returns the profile the engine models.
func (e *Engine) Profile() Profile { return e.p }

// HasWork reports whether any request is waiting or running.
func (e *Engine) HasWork() bool {
	return len(e.running) > 0 || e.waiting.len() > 0 || e.pending.len() > 0
}

// Stats returns the current counters.
func (e *Engine) Stats() Stats {
	s := e.stats
	s.Running, s.Waiting, s.Pending = len(e.running), e.waiting.len(), e.pending.len()
	s.UsedBlocks, s.TotalBlocks = e.kv.used(), e.kv.total()
	s.KVUsage = float64(s.UsedBlocks) / float64(s.TotalBlocks)
	return s
}

// CachedBlocks returns how many blocks the prefix cache holds findable by
// their hashes: stored and not yet evicted, held by a request or not.
func (e *Engine) CachedBlocks() int { return e.kv.published.len() }

// Add queues r, arrived at now. It fails if r's lengths are invalid or it
// could never fit in the model's context or the KV cache.
func (e *Engine) Add(now time.Duration, r *Request) error {
	if r.PromptLen < 1 || r.MaxTokens < 1 {
		return fmt.Errorf("%w: prompt of %d tokens, %d output tokens", ErrInvalid, r.PromptLen, r.MaxTokens)
	}
	if r.State != StateNew {
		return fmt.Errorf("%w: request %d already added", ErrInvalid, r.ID)
	}
	if r.Adapter != 0 && e.lora == nil {
		return fmt.Errorf("%w: request %d names an adapter and LoRA is off", ErrInvalid, r.ID)
	}
	total := r.PromptLen + r.MaxTokens
	if total > e.p.MaxModelLen {
		return fmt.Errorf("%w: %d prompt + %d output tokens > %d", ErrTooLong, r.PromptLen, r.MaxTokens, e.p.MaxModelLen)
	}
	if blocks := ceilDiv(total, e.p.BlockSize); blocks > e.seqBlocks() {
		return fmt.Errorf("%w: %d tokens need %d KV blocks, a sequence can have %d", ErrTooLong, total, blocks, e.seqBlocks())
	}
	e.Cut(now)
	r.Arrival = now
	r.State = StateWaiting
	if e.p.RequestOverhead > 0 {
		e.pending.pushBack(r)
		return nil
	}
	e.waiting.pushBack(r)
	return nil
}

// seqBlocks is the most KV blocks one sequence may hold: the whole cache,
// or with slots one slot's share, so that slots never run short.
func (e *Engine) seqBlocks() int {
	if e.slots != nil {
		return e.kv.total() / e.p.Slots
	}
	return e.kv.total()
}

// promote moves the pending requests whose overhead has passed by now to
// the waiting queue, and returns when the next one will be ready (0 when
// none is pending).
func (e *Engine) promote(now time.Duration) time.Duration {
	for e.pending.len() > 0 {
		r := e.pending.front()
		ready := r.Arrival + e.p.RequestOverhead
		if ready > now {
			return ready
		}
		e.pending.popFront()
		e.waiting.pushBack(r)
	}
	return 0
}

// Abort ends r at now and releases its KV blocks. It does nothing if r is
// done or was never added.
func (e *Engine) Abort(now time.Duration, r *Request) {
	e.Cut(now)
	switch r.State {
	case StateWaiting:
		e.waiting.remove(r)
		e.pending.remove(r)
	case StateRunning:
		for i, x := range e.running {
			if x == r {
				e.running = append(e.running[:i], e.running[i+1:]...)
				break
			}
		}
		e.slots.release(r, r.computed/e.p.BlockSize)
	default:
		return
	}
	e.kv.release(r.blocks)
	r.blocks = r.blocks[:0]
	r.State, r.Finish = StateAborted, now
	e.stats.Aborted++
}

// Step runs one scheduler iteration starting at now: it schedules work
// (running decodes first, then running prefills, then waiting requests in
// FCFS order, within the token budget and max_num_seqs), computes the step's
// duration and applies its results at the end of the step. It is one
// function of about a hundred lines because it is vLLM's scheduler loop,
// read side by side with vllm/v1/core/sched/scheduler.py's schedule():
// split, the order of its phases (which the replay digest pins) would be
// harder to check against the original.
func (e *Engine) Step(now time.Duration) StepResult {
	e.Settle(now)
	ready := e.promote(now)
	res := StepResult{Start: now, End: now}
	e.sched, e.tokens = e.sched[:0], e.tokens[:0]
	budget := e.p.MaxNumBatchedTokens
	preempted, stalled := false, false

	// Running requests first: decodes (one token each), then the next chunk
	// of prefills already under way.
	for pass := 0; pass < 2 && !stalled; pass++ {
		for i := 0; i < len(e.running); i++ {
			r := e.running[i]
			need := r.numTokens() - r.computed
			if (pass == 0) != (need == 1) || r.scheduled > 0 {
				continue
			}
			n := min(need, budget)
			if n == 0 {
				continue
			}
			ok, victims := e.reserveRunning(r, n)
			res.Preempted += victims
			preempted = preempted || victims > 0
			if !ok {
				stalled = true
				break
			}
			budget -= n
			// Preemption removes requests after i, never before.
		}
	}
	if preempted {
		budget = e.restoreBudget()
	}

	// Then waiting requests, unless this step had to preempt: the cache is
	// full and admitting more would only thrash.
	for e.lora == nil && !preempted && budget > 0 && len(e.running) < e.p.MaxNumSeqs && e.waiting.len() > 0 {
		r := e.waiting.front()
		if !e.admit(r, budget) {
			break
		}
		e.waiting.popFront()
		budget -= r.scheduled
	}
	if e.lora != nil && !preempted {
		budget = e.admitLoRA(budget)
	}

	if len(e.sched) == 0 {
		res.End = e.idleEnd(now, ready)
		return res
	}
	var w Work
	for _, r := range e.sched {
		w.AddChunk(r.computed, r.computed+r.scheduled)
		if r.numTokens()-r.computed == 1 && r.Output > 0 {
			res.DecodeTokens++
		} else {
			res.PrefillTokens += r.scheduled
		}
	}
	dur := e.rf.stepTime(w) + e.loadAdapters()
	res.ComputeTime, res.MemoryTime = e.rf.terms(w)
	res.End = now + dur
	e.stats.Steps++
	e.stats.BusyTime += dur

	// Apply the step: the blocks it filled become shareable, and a request
	// whose whole sequence is now computed samples its next token.
	finished := false
	for _, r := range e.sched {
		e.publish(r, r.computed, r.computed+r.scheduled)
		r.computed += r.scheduled
		r.scheduled = 0
		if r.computed < r.numTokens() {
			continue
		}
		r.Output++
		r.LastToken = res.End
		if r.Output == 1 {
			r.FirstToken = res.End
			e.stats.PromptTokens += int64(r.PromptLen)
		}
		e.stats.GenerationTokens++
		e.tokens = append(e.tokens, r)
		if r.Output >= r.MaxTokens {
			e.slots.release(r, r.computed/e.p.BlockSize)
			e.kv.release(r.blocks)
			r.blocks = r.blocks[:0]
			r.State, r.Finish = StateFinished, res.End
			e.stats.Finished++
			finished = true
		}
	}
	if finished {
		kept := e.running[:0]
		for _, r := range e.running {
			if r.State == StateRunning {
				kept = append(kept, r)
			}
		}
		clear(e.running[len(kept):])
		e.running = kept
	}
	res.Tokens = e.tokens
	return res
}

// idleEnd is the end of a step that scheduled nothing: now, or, when only
// requests in their overhead remain, an idle wait until the first is ready
// (no tokens, no busy time), so that the caller comes back then rather than
// at the next arrival.
func (e *Engine) idleEnd(now, ready time.Duration) time.Duration {
	if len(e.running) == 0 && e.waiting.len() == 0 && ready > now {
		return ready
	}
	return now
}

// restoreBudget recomputes the budget left after the running passes (a
// preempted request gives its tokens back).
func (e *Engine) restoreBudget() int {
	b := e.p.MaxNumBatchedTokens
	for _, r := range e.sched {
		b -= r.scheduled
	}
	return b
}

// reserveRunning gives running request r the blocks for n more tokens,
// preempting the newest running requests while the cache is short. It
// reports false if r itself had to be preempted, and how many were.
func (e *Engine) reserveRunning(r *Request, n int) (ok bool, victims int) {
	need := ceilDiv(r.computed+n, e.p.BlockSize) - len(r.blocks)
	for e.kv.free < need {
		v := e.running[len(e.running)-1]
		e.preempt(v)
		victims++
		if v == r {
			return false, victims
		}
	}
	e.grow(r, n, need)
	e.sched = append(e.sched, r)
	return true, victims
}

// admit schedules waiting request r with at most budget tokens, reusing the
// longest cached prefix. It reports false, changing nothing, if the cache
// cannot hold the chunk.
func (e *Engine) admit(r *Request, budget int) bool {
	// At least one token must be computed to sample from, so a prompt that is
	// wholly cached still recomputes its last block.
	maxHit := min((r.numTokens()-1)/e.p.BlockSize, len(r.BlockHashes))
	if e.p.NoPrefixCaching {
		maxHit = 0
	}
	var hits, idle, slot, computed int
	if e.slots != nil {
		// No shared cache: only what the chosen slot holds is reused, in
		// blocks of its own (all newly allocated below).
		var kept int
		slot, kept = e.slots.pick(r.BlockHashes[:maxHit])
		computed = kept * e.p.BlockSize
	} else {
		hits, idle = e.kv.lookup(r.BlockHashes[:maxHit])
		computed = hits * e.p.BlockSize
	}
	local := computed
	if remote := min(r.RemoteTokens, r.PromptLen-1); remote > computed && e.slots == nil {
		computed = remote // pulled from the prefill server, not computed (RemoteTokens)
	}
	n := min(r.numTokens()-computed, budget)
	need := ceilDiv(computed+n, e.p.BlockSize) - hits
	if e.kv.free-idle < need {
		return false
	}
	if most := ceilDiv(r.PromptLen+r.MaxTokens, e.p.BlockSize); cap(r.blocks) < most {
		// One list of the most blocks r can hold, not a list doubled as it
		// grows: with 16-token blocks a prompt takes hundreds, and growing
		// them was a tenth of a simulation's time.
		r.blocks = make([]int32, 0, most)
	}
	r.blocks = e.kv.take(r.blocks[:0], hits)
	r.computed = computed
	e.slots.claim(slot, r)
	if !r.admitted {
		r.admitted = true
		r.CachedTokens = computed
		e.stats.PrefixQueries += int64(r.PromptLen)
		e.stats.PrefixHits += int64(min(local, r.PromptLen))
	}
	e.grow(r, n, need)
	if computed > local {
		e.publish(r, local, computed) // the pulled blocks are cached as computed ones
	}
	r.State = StateRunning
	e.running = append(e.running, r)
	e.sched = append(e.sched, r)
	return true
}

// grow allocates need blocks to r and schedules n more of its tokens.
func (e *Engine) grow(r *Request, n, need int) {
	var evicted int
	r.blocks, evicted = e.kv.allocate(r.blocks, need)
	e.stats.EvictedBlocks += int64(evicted)
	r.scheduled = n
}

// publish makes the blocks that tokens [from, to) of r completed findable by
// their hashes.
func (e *Engine) publish(r *Request, from, to int) {
	if e.slots != nil {
		return // a slot's KV is its own: nothing is shared
	}
	end := min(to/e.p.BlockSize, len(r.BlockHashes))
	cur := hashtab.NewCursor()
	for i := from / e.p.BlockSize; i < end; i++ {
		if e.kv.publish(&cur, r.blocks[i], r.BlockHashes, i) && e.observer != nil {
			e.observer.Stored(r, i)
		}
	}
}

// preempt takes r's blocks (they stay cached) and puts it at the head of the
// waiting queue, to be recomputed from whatever of it is still cached.
func (e *Engine) preempt(r *Request) {
	for i := len(e.running) - 1; i >= 0; i-- {
		if e.running[i] == r {
			e.running = append(e.running[:i], e.running[i+1:]...)
			break
		}
	}
	if r.scheduled > 0 {
		for i, x := range e.sched {
			if x == r {
				e.sched = append(e.sched[:i], e.sched[i+1:]...)
				break
			}
		}
		r.scheduled = 0
	}
	e.slots.release(r, r.computed/e.p.BlockSize)
	e.kv.release(r.blocks)
	r.blocks = r.blocks[:0]
	r.computed = 0
	r.State = StateWaiting
	r.Preemptions++
	e.stats.Preemptions++
	e.waiting.pushFront(r)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// queue is a FIFO of requests that can also take one back at its head.
type queue struct {
	items []*Request
	head  int
}

func (q *queue) len() int { return len(q.items) - q.head }

func (q *queue) front() *Request { return q.items[q.head] }

func (q *queue) pushBack(r *Request) { q.items = append(q.items, r) }

func (q *queue) popFront() {
	q.items[q.head] = nil
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.head > 1024 && q.head > len(q.items)/2 {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
}

func (q *queue) pushFront(r *Request) {
	if q.head > 0 {
		q.head--
		q.items[q.head] = r
		return
	}
	q.items = append(q.items, nil)
	copy(q.items[1:], q.items)
	q.items[0] = r
}

func (q *queue) remove(r *Request) {
	for i := q.head; i < len(q.items); i++ {
		if q.items[i] == r {
			copy(q.items[i:], q.items[i+1:])
			q.items[len(q.items)-1] = nil
			q.items = q.items[:len(q.items)-1]
			return
		}
	}
}
