package sim

import (
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/router"
)

// DefaultKVEventDelay is how long a server's KV events take to reach the
// routers by default: vLLM publishes a step's events when the step ends,
// and a ZMQ message on a local network takes well under a millisecond;
// the rest is the subscriber's queue.
const DefaultKVEventDelay = 10 * time.Millisecond

// kvFeed models the servers' KV events (Config.KVEvents): every block a
// server's engine stores or evicts becomes an event that reaches one store,
// shared by every router replica as every replica would subscribe to every
// server, Config.KVEventDelay after the step that made it ends. Blocks are
// named by the engine's own hashes (kvevents.KeyEngine): simulator and
// engines share one process, so the routers can hash prompts as the
// engines do.
type kvFeed struct {
	s     *simulation
	store *kvevents.Store
	delay time.Duration
	// queued are the batches not yet delivered, per server, oldest first.
	queued [][]kvBatch
	// stepping is the server whose Step is running (its events wait for
	// the step's end), -1 outside one.
	stepping int
	pending  []kvevents.Event // the running step's
	// prompt is the engine block hashes of the prompt being routed, as far
	// as the engine can reuse them.
	prompt []uint64
	// Match's scratch.
	idx     []int
	matched []kvevents.Matched
}

type kvBatch struct {
	at     time.Duration
	events []kvevents.Event
}

// newKVFeed starts the feed: every server's engine starts empty, so its
// state is exact from the first event.
func newKVFeed(s *simulation) *kvFeed {
	k := &kvFeed{s: s, store: kvevents.NewStore(kvevents.KeyEngine), delay: s.cfg.KVEventDelay,
		queued: make([][]kvBatch, len(s.servers)), stepping: -1}
	for i := range s.servers {
		k.store.Reset(i, kvevents.Exact)
		s.servers[i].eng.SetObserver(&kvObserver{feed: k, server: i})
	}
	return k
}

var _ engine.BlockObserver = (*kvObserver)(nil)

// kvObserver hears one server's engine.
type kvObserver struct {
	feed   *kvFeed
	server int
}

func (o *kvObserver) Stored(r *engine.Request, i int) {
	if ev := o.feed.last(o.server, kvevents.BlockStored); ev != nil && i > 0 && ev.Hashes[len(ev.Hashes)-1] == r.BlockHashes[i-1] {
		ev.Hashes = append(ev.Hashes, r.BlockHashes[i]) // the next block of the same chain
		return
	}
	ev := kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{r.BlockHashes[i]},
		BlockSize: o.feed.s.cfg.Profile.BlockSize, Medium: kvevents.MediumGPU}
	if i > 0 {
		ev.Parent, ev.HasParent = r.BlockHashes[i-1], true
	}
	o.feed.add(o.server, ev)
}

func (o *kvObserver) Evicted(hash uint64) {
	if ev := o.feed.last(o.server, kvevents.BlockRemoved); ev != nil {
		ev.Hashes = append(ev.Hashes, hash)
		return
	}
	o.feed.add(o.server, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{hash}, Medium: kvevents.MediumGPU})
}

// add queues one event of server i: with the running step's, or, made
// outside a step (decodes applied lazily, an abort), delivered from now.
func (k *kvFeed) add(i int, ev kvevents.Event) {
	if k.stepping == i {
		k.pending = append(k.pending, ev)
		return
	}
	k.send(i, k.s.now, ev)
}

// last returns the event of server i that a next one may extend: the
// last of the running step's, or of the batch queued for now, if it is of
// kind k.
func (k *kvFeed) last(i int, kind kvevents.Kind) *kvevents.Event {
	var evs []kvevents.Event
	if k.stepping == i {
		evs = k.pending
	} else if q := k.queued[i]; len(q) > 0 && q[len(q)-1].at == k.s.now+k.delay {
		evs = q[len(q)-1].events
	}
	if n := len(evs); n > 0 && evs[n-1].Kind == kind {
		return &evs[n-1]
	}
	return nil
}

// stepped delivers the events of server i's step, which ends at end.
func (k *kvFeed) stepped(i int, end time.Duration) {
	k.stepping = -1
	if len(k.pending) > 0 {
		k.send(i, end, k.pending...)
		k.pending = k.pending[:0]
	}
}

// send queues events of server i made at at, to arrive after the delay: in
// the last batch if it arrives then too, else in a new one with its own
// delivery event.
func (k *kvFeed) send(i int, at time.Duration, evs ...kvevents.Event) {
	at += k.delay
	q := k.queued[i]
	if n := len(q); n > 0 && q[n-1].at == at {
		q[n-1].events = append(q[n-1].events, evs...)
		return
	}
	k.queued[i] = append(q, kvBatch{at: at, events: append([]kvevents.Event(nil), evs...)})
	k.s.q.push(at, evKVEvents, int32(i))
}

// deliver applies server i's batches that have arrived by now.
func (k *kvFeed) deliver(i int) {
	q := k.queued[i]
	n := 0
	for n < len(q) && q[n].at <= k.s.now {
		k.store.Apply(i, &kvevents.Batch{Events: q[n].events})
		n++
	}
	k.queued[i] = q[n:]
}

// routing tells the feed the engine block hashes of the prompt about to be
// routed, prompt tokens long: the engine reuses at most the blocks before
// the prompt's last token.
func (k *kvFeed) routing(hashes []uint64, promptTokens int) {
	bs := k.s.cfg.Profile.BlockSize
	k.prompt = hashes[:max(0, min(len(hashes), (promptTokens-1)/bs))]
}

var _ router.KVEvents = (*kvFeed)(nil)

// Match implements router.KVEvents.
func (k *kvFeed) Match(_ *router.Request, cands []*fleet.Backend, dst []router.KVState) {
	k.idx, k.matched = k.idx[:0], slices.Grow(k.matched[:0], len(cands))[:len(cands)]
	for _, b := range cands {
		k.idx = append(k.idx, b.Index)
	}
	k.store.MatchGPU(k.idx, func(int) []uint64 { return k.prompt }, k.matched)
	for i, m := range k.matched {
		dst[i] = router.KVState{Tokens: m.Blocks * m.BlockSize, Known: m.State != kvevents.Unknown, Exact: m.State == kvevents.Exact}
	}
}

var _ router.KVHolders = (*kvFeed)(nil)

// Holders implements router.KVHolders.
func (k *kvFeed) Holders(_ *router.Request, _ []*fleet.Backend, dst []int32, want int) []int32 {
	return k.store.Deepest(dst, func(int) []uint64 { return k.prompt }, want)
}
