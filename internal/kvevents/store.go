package kvevents

import (
	"encoding/binary"
	"sync"

	"github.com/cespare/xxhash/v2"
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
}

// holdings is one backend's blocks.
type holdings struct {
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
func NewStore(key Key) *Store { return &Store{key: key, backends: make(map[int]*holdings)} }

func (s *Store) holdingsOf(backend int) *holdings {
	h := s.backends[backend]
	if h == nil {
		h = &holdings{media: make(map[string]*medium)}
		s.backends[backend] = h
	}
	return h
}

// Reset forgets every block of backend and sets its state: Exact for an
// engine known to start empty, Partial or Unknown otherwise.
func (s *Store) Reset(backend int, st State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.holdingsOf(backend)
	clear(h.media)
	h.state, h.orphans = st, 0
}

// SetState sets backend's state, keeping its blocks.
func (s *Store) SetState(backend int, st State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdingsOf(backend).state = st
}

// Remove forgets backend altogether: it left the fleet.
func (s *Store) Remove(backend int) {
	s.mu.Lock()
	defer s.mu.Unlock()
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
		clear(h.media)
	case BlockStored:
		if e.BlockSize > 0 {
			h.blockSize = e.BlockSize
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

func (h *holdings) mediumOf(name string, key Key) *medium {
	m := h.media[name]
	if m == nil {
		m = &medium{byHash: make(map[uint64]stored)}
		if key == KeyTokens {
			m.keys = make(map[uint64]int32)
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
	if key != 0 && m.keys != nil {
		m.keys[key]++
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
	}
}

// Match returns backend's state and block size, and how many leading
// blocks of keys (a prompt's chain, as TokenChain or the engine makes it
// for that block size) it holds on the GPU, and on the GPU or the CPU.
func (s *Store) Match(backend int, keys func(blockSize int) []uint64) (st State, blockSize, gpu, any int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	h := s.backends[backend]
	if h == nil || h.state == Unknown || h.blockSize <= 0 {
		if h != nil {
			return h.state, h.blockSize, 0, 0
		}
		return Unknown, 0, 0, 0
	}
	ks := keys(h.blockSize)
	g, c := h.media[MediumGPU], h.media[MediumCPU]
	for _, k := range ks {
		inGPU := g.holds(k)
		if !inGPU && !c.holds(k) {
			break
		}
		if inGPU && gpu == any {
			gpu++
		}
		any++
	}
	return h.state, h.blockSize, gpu, any
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

// rootKey is the parent key of a base-model prompt's first block.
const rootKey uint64 = 0x6b762d6576656e74 // "kv-event"

// loraRoot is the parent key of a prompt's first block under a LoRA
// adapter: blocks computed with an adapter are not the base model's.
func loraRoot(id int, name string) uint64 {
	if id == 0 && name == "" {
		return rootKey
	}
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], uint64(id))
	return xxhash.Sum64String(string(buf[:])+name) ^ rootKey
}

// TokenChain appends to dst the keys of the full blockSize blocks of
// tokens, a base-model prompt: key i covers key i-1 and block i's token
// ids, as the engines' own chains do.
func TokenChain(dst []uint64, tokens []int32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	parent := rootKey
	for start := 0; start+blockSize <= len(tokens); start += blockSize {
		parent = chainStep(parent, tokens[start:start+blockSize])
		dst = append(dst, parent)
	}
	return dst
}

func chainStep(parent uint64, block []int32) uint64 {
	var d xxhash.Digest
	var buf [8]byte
	d.Reset()
	binary.LittleEndian.PutUint64(buf[:], parent)
	d.Write(buf[:])
	for _, t := range block {
		binary.LittleEndian.PutUint32(buf[:4], uint32(t))
		d.Write(buf[:4])
	}
	k := d.Sum64()
	if k == 0 { // 0 means unmatchable
		k = 1
	}
	return k
}
