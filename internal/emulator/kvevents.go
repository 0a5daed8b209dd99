package emulator

import (
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/kvevents"
)

// kvEvents turns the engine's block stores and evictions into vLLM's KV
// events: the events of one scheduler step make one batch, a request's
// blocks stored in a step one BlockStored (with their token ids and the
// hash of the block before them), the blocks evicted one BlockRemoved.
// Its observer methods run under Server.mu, inside the engine's calls.
// As SGLang (perPage), each block stored or evicted is an event of its own.
type kvEvents struct {
	pub     *kvevents.Publisher
	tokens  func(id uint64) []int32 // a request's sequence, prompt and output
	bsize   int
	perPage bool
	pending []kvevents.Event
	// lastReq and lastBlock are the request and block of the pending
	// BlockStored at the end, which a next block of it extends.
	lastReq   uint64
	lastBlock int
}

var _ engine.BlockObserver = (*kvEvents)(nil)

// Stored implements engine.BlockObserver.
func (k *kvEvents) Stored(r *engine.Request, i int) {
	seq := k.tokens(r.ID)
	if (i+1)*k.bsize > len(seq) {
		return // not a call of ours: it has no tokens
	}
	toks := seq[i*k.bsize : (i+1)*k.bsize]
	if n := len(k.pending); !k.perPage && n > 0 && k.pending[n-1].Kind == kvevents.BlockStored && k.lastReq == r.ID && k.lastBlock == i-1 {
		ev := &k.pending[n-1]
		ev.Hashes = append(ev.Hashes, r.BlockHashes[i])
		ev.Tokens = append(ev.Tokens, toks...)
	} else {
		ev := kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{r.BlockHashes[i]},
			Tokens: append([]int32(nil), toks...), BlockSize: k.bsize, Medium: kvevents.MediumGPU}
		if i > 0 {
			ev.Parent, ev.HasParent = r.BlockHashes[i-1], true
		}
		k.pending = append(k.pending, ev)
	}
	k.lastReq, k.lastBlock = r.ID, i
}

// Evicted implements engine.BlockObserver.
func (k *kvEvents) Evicted(hash uint64) {
	if n := len(k.pending); !k.perPage && n > 0 && k.pending[n-1].Kind == kvevents.BlockRemoved {
		k.pending[n-1].Hashes = append(k.pending[n-1].Hashes, hash)
		return
	}
	k.pending = append(k.pending, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{hash}, Medium: kvevents.MediumGPU})
	k.lastReq = 0
}

// take returns the pending events as a batch stamped now, and starts a new
// one. Call with Server.mu held.
func (k *kvEvents) take(now time.Time) (kvevents.Batch, bool) {
	if len(k.pending) == 0 {
		return kvevents.Batch{}, false
	}
	b := kvevents.Batch{TS: float64(now.UnixNano()) / 1e9, Events: k.pending, HasDPRank: true}
	k.pending, k.lastReq = nil, 0
	return b, true
}

// publishEvents publishes the events the engine made since the last call,
// if the server publishes any. It takes s.mu.
func (s *Server) publishEvents() {
	if s.kv == nil {
		return
	}
	s.mu.Lock()
	b, ok := s.kv.take(s.clock.Now())
	s.mu.Unlock()
	if ok {
		if _, err := s.kv.pub.Publish(b); err != nil {
			s.log.Warn("kv events: publish failed", "err", err)
		}
	}
}

// callTokens returns the sequence of the call with engine id id. Called
// with s.mu held.
func (s *Server) callTokens(id uint64) []int32 {
	if c := s.calls[id]; c != nil {
		return c.seq
	}
	return nil
}

// KVEventsAddr returns the addresses of the KV event PUB and replay
// sockets ("" when not published): with port 0 in the config, the ports
// the system chose.
func (s *Server) KVEventsAddr() (pub, replay string) {
	if s.kv == nil {
		return "", ""
	}
	if a := s.kv.pub.Addr(); a != nil {
		pub = "tcp://" + a.String()
	}
	if a := s.kv.pub.ReplayAddr(); a != nil {
		replay = "tcp://" + a.String()
	}
	return pub, replay
}

// KVEventBatches returns how many KV event batches the server has
// published.
func (s *Server) KVEventBatches() int64 {
	if s.kv == nil {
		return 0
	}
	return s.kv.pub.Published()
}

// CachedBlocks returns how many blocks the engine's prefix cache holds
// findable: what its events have announced and not yet removed.
func (s *Server) CachedBlocks() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eng.CachedBlocks()
}
