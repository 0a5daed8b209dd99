package kvevents

import (
	"slices"
	"sync"
)

// Key is how a Store names the blocks it matches prompts against.
type Key uint8

const (
	// KeyTokens names a block by TokenChain over the token ids its
	// BlockStored event carries: independent of the engine's hash function
	// and seed, which the router cannot reproduce.
	KeyTokens Key = iota
	// KeyEngine names a block by the engine's own hash: for a caller that
	// hashes prompts as the engine does (the simulator).
	KeyEngine
)

// State says how far a backend's blocks in a Store can be trusted.
type State uint8

const (
	// Unknown: no events yet (none published, not subscribed, or a gap
	// being recovered); match with the approximate index.
	Unknown State = iota
	// Partial: events since some point only (the router joined a running
	// engine, or a gap could not be replayed): what the store holds is
	// there, but more may be.
	Partial
	// Exact: every event since the engine started, in order.
	Exact
)

// Store is, per backend and per medium, the set of blocks its engine
// holds, from its KV events. It is safe for concurrent use: Apply and
// Reset take a write lock, Match a read lock.
type Store struct {
	key      Key
	mu       sync.RWMutex
	backends map[int]*holdings
	// holders are, per key, the backends holding it on the GPU: a
	// prompt's match walks its keys once for the whole fleet, as the
	// prefix index does, instead of once per backend.
	holders map[uint64][]int32
	// info is every backend's state and block size by index, contiguous:
	// what MatchGPU reads for each candidate (synced by summarize).
	info []summary
	// sizes are the block sizes any backend has had, each once: the
	// chains Deepest walks (a size no backend has any more finds no
	// holders).
	sizes []int
}

type summary struct {
	state     State
	blockSize int32
}

// summarize copies h's state and block size into info. Call with mu held
// for writing.
func (s *Store) summarize(h *holdings) {
	for int(h.backend) >= len(s.info) {
		s.info = append(s.info, summary{})
	}
	s.info[h.backend] = summary{h.state, int32(h.blockSize)}
	if h.blockSize > 0 && !slices.Contains(s.sizes, h.blockSize) {
		s.sizes = append(s.sizes, h.blockSize)
	}
}

// holdings is one backend's blocks.
type holdings struct {
	backend   int32
	store     *Store
	state     State
	blockSize int
	media     map[string]*medium
	// orphans counts stored blocks whose parent was unknown (a partial
	// state's): they can be removed but never matched.
	orphans int64
	// applied counts the batches applied, across resets.
	applied int64
}

// medium is one tier's blocks: by engine hash, the key each stands for
// (0: unmatchable) and how many times the engine stored it (vLLM may store
// one hash twice when two requests compute a block at once); and how many
// engine blocks hold each key. With KeyEngine the keys are the hashes and
// keys stays nil: byHash answers for both.
type medium struct {
	byHash map[uint64]stored
	keys   map[uint64]int32
	// held, for the GPU medium, hears a key become held or not.
	held func(key uint64, on bool)
}

func (m *medium) note(key uint64, on bool) {
	if m.held != nil {
		m.held(key, on)
	}
}

// release tells held that every key is gone, before the medium is dropped.
func (m *medium) release() {
	if m.held == nil {
		return
	}
	if m.keys != nil {
		for k := range m.keys {
			m.held(k, false)
		}
		return
	}
	for h := range m.byHash {
		m.held(h, false)
	}
}

// holds reports whether the medium holds a block keyed key.
func (m *medium) holds(key uint64) bool {
	if m == nil {
		return false
	}
	if m.keys == nil {
		return m.byHash[key].refs > 0
	}
	return m.keys[key] > 0
}

type stored struct {
	key  uint64
	refs int32
}

// NewStore returns an empty store naming blocks by key.
func NewStore(key Key) *Store {
	return &Store{key: key, backends: make(map[int]*holdings), holders: make(map[uint64][]int32)}
}

func (s *Store) holdingsOf(backend int) *holdings {
	h := s.backends[backend]
	if h == nil {
		h = &holdings{media: make(map[string]*medium), backend: int32(backend), store: s}
		s.backends[backend] = h
	}
	return h
}

// hold records that backend holds key on the GPU, or no longer does.
// Call with mu held for writing.
func (s *Store) hold(backend int32, key uint64, on bool) {
	hs := s.holders[key]
	if on {
		s.holders[key] = append(hs, backend)
		return
	}
	for i, b := range hs {
		if b == backend {
			hs[i] = hs[len(hs)-1]
			hs = hs[:len(hs)-1]
			break
		}
	}
	if len(hs) == 0 {
		delete(s.holders, key)
	} else {
		s.holders[key] = hs
	}
}

// clearMedia drops every block of h.
func (h *holdings) clearMedia() {
	for _, m := range h.media {
		m.release()
	}
	clear(h.media)
}

// Reset forgets every block of backend and sets its state: Exact for an
// engine known to start empty, Partial or Unknown otherwise.
func (s *Store) Reset(backend int, st State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.holdingsOf(backend)
	h.clearMedia()
	// A restarted engine may use another block size: its first event says.
	h.state, h.orphans, h.blockSize = st, 0, 0
	s.summarize(h)
}

// SetState sets backend's state, keeping its blocks.
func (s *Store) SetState(backend int, st State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.holdingsOf(backend)
	h.state = st
	s.summarize(h)
}

// Remove forgets backend altogether: it left the fleet.
func (s *Store) Remove(backend int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.backends[backend]; h != nil {
		h.clearMedia()
		h.state, h.blockSize = Unknown, 0
		s.summarize(h)
	}
	delete(s.backends, backend)
}

// Apply applies one batch of backend's events, in order.
func (s *Store) Apply(backend int, b *Batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.holdingsOf(backend)
	for i := range b.Events {
		s.apply(h, &b.Events[i])
	}
	h.applied++
}

// Applied returns how many batches of backend's the store has applied.
func (s *Store) Applied(backend int) int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if h := s.backends[backend]; h != nil {
		return h.applied
	}
	return 0
}

// apply applies one event. Events of KV cache groups other than the first
// (hybrid models' sliding-window layers) are ignored: a prefix is reusable
// as far as the full-attention group holds it.
func (s *Store) apply(h *holdings, e *Event) {
	if e.Group != 0 {
		return
	}
	switch e.Kind {
	case AllBlocksCleared:
		h.clearMedia()
	case BlockStored:
		if e.BlockSize > 0 && e.BlockSize != h.blockSize && !h.tailPage(e) {
			h.blockSize = e.BlockSize
			s.summarize(h)
		}
		s.store(h, h.mediumOf(e.Medium, s.key), e)
	case BlockRemoved:
		m := h.media[e.Medium]
		if m == nil {
			return
		}
		for _, hash := range e.Hashes {
			m.remove(hash)
		}
	}
}

// tailPage reports whether e is one page shorter than the engine's
// blocks: SGLang stores a radix node that ends between pages with a short
// last page. The prompts stay matched in whole blocks; the short page is
// kept, to be removed, but no prompt's chain names it.
func (h *holdings) tailPage(e *Event) bool {
	return len(e.Hashes) == 1 && e.BlockSize < h.blockSize
}

func (h *holdings) mediumOf(name string, key Key) *medium {
	m := h.media[name]
	if m == nil {
		m = &medium{byHash: make(map[uint64]stored)}
		if key == KeyTokens {
			m.keys = make(map[uint64]int32)
		}
		if name == MediumGPU {
			m.held = func(k uint64, on bool) { h.store.hold(h.backend, k, on) }
		}
		h.media[name] = m
	}
	return m
}

// store adds a BlockStored event's blocks to m, each keyed by its chain
// from its parent's key.
func (s *Store) store(h *holdings, m *medium, e *Event) {
	if s.key == KeyEngine {
		for _, hash := range e.Hashes {
			m.add(hash, hash)
		}
		return
	}
	parent, ok := loraRoot(e.LoRAID, e.LoRAName), true
	if e.HasParent {
		parent, ok = h.keyOf(e.Parent, e.Medium)
	}
	if len(e.Tokens) != len(e.Hashes)*e.BlockSize || e.BlockSize <= 0 {
		ok = false
	}
	for i, hash := range e.Hashes {
		key := uint64(0)
		if ok {
			key = chainStep(parent, e.Tokens[i*e.BlockSize:(i+1)*e.BlockSize])
			parent = key
		} else {
			h.orphans++
		}
		m.add(hash, key)
	}
}

// keyOf returns the key of the block with engine hash hash: in medium
// first, else in any (a block offloaded to the CPU may hang off one still
// on the GPU).
func (h *holdings) keyOf(hash uint64, medium string) (uint64, bool) {
	if m := h.media[medium]; m != nil {
		if st, ok := m.byHash[hash]; ok {
			return st.key, st.key != 0
		}
	}
	for _, m := range h.media {
		if st, ok := m.byHash[hash]; ok {
			return st.key, st.key != 0
		}
	}
	return 0, false
}

func (m *medium) add(hash, key uint64) {
	st, had := m.byHash[hash]
	if had && st.key != key {
		// The engine reused the hash for other content (a new chain after
		// a reset it did not announce): the new content wins.
		m.dropKey(st.key, st.refs)
		st = stored{}
	}
	st.key = key
	st.refs++
	m.byHash[hash] = st
	switch {
	case m.keys == nil && st.refs == 1: // engine keys: the hash is the key
		m.note(hash, true)
	case key != 0 && m.keys != nil:
		if m.keys[key]++; m.keys[key] == 1 {
			m.note(key, true)
		}
	}
}

func (m *medium) remove(hash uint64) {
	st, ok := m.byHash[hash]
	if !ok {
		return
	}
	m.dropKey(st.key, 1)
	if st.refs--; st.refs <= 0 {
		delete(m.byHash, hash)
		if m.keys == nil {
			m.note(hash, false)
		}
		return
	}
	m.byHash[hash] = st
}

func (m *medium) dropKey(key uint64, n int32) {
	if key == 0 || m.keys == nil {
		return
	}
	if m.keys[key] -= n; m.keys[key] <= 0 {
		delete(m.keys, key)
		m.note(key, false)
	}
}

// Blocks returns how many blocks backend holds in medium (engine hashes,
// each counted once).
func (s *Store) Blocks(backend int, medium string) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if h := s.backends[backend]; h != nil && h.media[medium] != nil {
		return len(h.media[medium].byHash)
	}
	return 0
}

// Status returns backend's state and its orphan blocks.
func (s *Store) Status(backend int) (State, int64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if h := s.backends[backend]; h != nil {
		return h.state, h.orphans
	}
	return Unknown, 0
}
