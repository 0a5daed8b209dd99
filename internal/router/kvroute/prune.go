package kvroute

import (
	"slices"
	"sync"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// kvroute scores only the candidates that can win, so that a decision
// costs the same at a hundred backends and at ten thousand: the backends
// holding the deepest part of the prompt (the index's MatchFew), the
// session's backend, and the least loaded (by in-flight requests, kept in
// buckets updated as requests are routed and finish). A backend outside
// that set holds less of the prompt than the holders and has more requests
// in flight than the least loaded: it can win only where the cost's other
// terms (a slow backend, a long queue of prefill behind few requests)
// reorder them, which the least loaded's number leaves room for.
const (
	// defaultPruneLeast is how many of the least loaded candidates a
	// pruned pick scores.
	defaultPruneLeast = 16
	// defaultPruneHolders bounds the prefix holders a pruned pick scores,
	// deepest first: a system prompt every backend holds would otherwise
	// bring in the whole fleet.
	defaultPruneHolders = 16
)

// pruning reports whether a pick among n candidates scores a pruned set:
// unless FullScan, when the fleet is larger than twice the set (below
// that, the scan is as cheap and every backend is scored).
func (c Config) pruning(n int) bool {
	return !c.FullScan && n > 2*(c.PruneLeast+c.PruneHolders)
}

// match fills s.matched and s.recent, as p.index.Match does, for the
// candidates it returns: all of cands after a full match, or, when pruning,
// the few that can win. It returns the longest match in the index among
// them, and the requests in flight on the whole fleet (-1 for a full scan,
// which sums them itself): the pruner's count of this replica's, plus the
// other replicas' (fleetInFlight). The holders come from the index and,
// when Events can name them (KVHolders), from the engines' events.
func (p *Policy) match(s *pickScratch, req *router.Request, cands []*fleet.Backend, mine lane) ([]*fleet.Backend, int, int64) {
	if !p.cfg.pruning(len(cands)) {
		return cands, p.index.Match(s.hashes, s.matched, s.recent), -1
	}
	session := int32(-1)
	if req.SessionKey != "" {
		p.mu.Lock()
		if i, ok := p.sessions[req.SessionKey]; ok {
			session = int32(i)
		}
		p.mu.Unlock()
	}
	pr := &p.prune
	pr.mu.Lock()
	at := pr.positions(req.Model, cands)
	s.few = pr.least(s.few[:0], cands, at, mine, p.cfg.PruneLeast)
	if session >= 0 && !slices.Contains(s.few, session) && at.find(cands, int(session)) >= 0 {
		s.few = append(s.few, session)
	}
	total := pr.total
	pr.mu.Unlock()

	if h, ok := p.cfg.Events.(router.KVHolders); ok {
		s.few = h.Holders(req, cands, s.few, p.cfg.PruneHolders)
	}
	s.few, _ = p.index.MatchFew(s.hashes, s.few, p.cfg.PruneHolders, s.matched, s.recent)
	s.sub = s.sub[:0]
	longest := 0
	pr.mu.Lock()
	for _, i := range s.few {
		if j := at.find(cands, int(i)); j >= 0 {
			s.sub = append(s.sub, cands[j])
			longest = max(longest, s.matched[i])
		}
	}
	pr.mu.Unlock()
	return s.sub, longest, p.fleetInFlight(total, cands, p.cfg.Now())
}

// pruner keeps the backends in buckets by their requests in flight, each
// bucket a list in the order its backends entered it, so that the least
// loaded are found without a scan, and among equally loaded ones the pick
// rotates. Its counts are the router's (fleet.Backend.Load), read when a
// pick routes a request to a backend, when the request ends, and whenever
// a pick finds one it looks at changed. Safe for concurrent use.
type pruner struct {
	mu sync.Mutex
	// key is each backend's bucket (its requests in flight, capped at
	// maxBucket), -1 when not tracked; prev and next link its bucket.
	key, prev, next []int32
	head, tail      []int32 // per bucket
	low             int     // no bucket below is non-empty
	total           int64   // the tracked backends' requests in flight
	// pos is, per model, where each backend was in the candidates of the
	// last pick that looked for one (see positions).
	pos map[string]*positions
	// weigh, behind router replicas, is a backend's requests in flight
	// with the other replicas' last reports (Policy.inFlight); nil: its
	// own count. backends is every tracked backend, by index.
	weigh    func(*fleet.Backend) int64
	backends []*fleet.Backend
}

// count is b's requests in flight as the pruner orders backends.
func (pr *pruner) count(b *fleet.Backend) int64 {
	if pr.weigh != nil {
		return pr.weigh(b)
	}
	return b.Load().Requests
}

// weighPeers, behind router replicas, orders the backends by their
// requests in flight on the whole fleet, this replica's and the others'
// last reports, and has every backend tell the pruner of each new report
// (peersReported). Ordered by its own counts alone, a replica's least
// loaded were often the others' busiest; and pushed reports arrive one
// backend at a time, so a backend whose count fell behind others' pushes
// would keep its old bucket until a pick happened to route there.
func (pr *pruner) weighPeers(p *Policy, backends []*fleet.Backend) {
	if p.cfg.Replicas <= 1 {
		return
	}
	pr.mu.Lock()
	pr.weigh = p.inFlight
	pr.mu.Unlock()
	for _, b := range backends {
		b.WatchPeerLoad(pr.peersReported)
	}
}

// peersReported re-reads b's requests in flight: the other replicas
// reported theirs.
func (pr *pruner) peersReported(b *fleet.Backend) {
	pr.mu.Lock()
	if i := b.Index; i < len(pr.backends) && pr.backends[i] == b && pr.key[i] >= 0 {
		pr.track(i, pr.count(b))
	}
	pr.mu.Unlock()
}

// maxBucket bounds the buckets: more requests than that on one backend
// all count as that many for the order.
const maxBucket = 1 << 12

const noBackend int32 = -1

// setBackends tracks backends and forgets the rest.
func (pr *pruner) setBackends(backends []*fleet.Backend) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	keep := make(map[int]bool, len(backends))
	for _, b := range backends {
		keep[b.Index] = true
		for len(pr.backends) <= b.Index {
			pr.backends = append(pr.backends, nil)
		}
		pr.backends[b.Index] = b
		pr.track(b.Index, pr.count(b))
	}
	for i, k := range pr.key {
		if k >= 0 && !keep[i] {
			pr.untrack(i)
			pr.backends[i] = nil
		}
	}
	clear(pr.pos)
}

// routed counts a request the pick has just routed to b, before the
// router counts it there itself.
func (pr *pruner) routed(b *fleet.Backend) {
	pr.mu.Lock()
	if b.Index < len(pr.key) && pr.key[b.Index] >= 0 {
		pr.track(b.Index, pr.count(b)+1)
	}
	pr.mu.Unlock()
}

// settle re-reads b's requests in flight: one of them has ended.
func (pr *pruner) settle(b *fleet.Backend) {
	pr.mu.Lock()
	if b.Index < len(pr.key) && pr.key[b.Index] >= 0 {
		pr.track(b.Index, pr.count(b))
	}
	pr.mu.Unlock()
}

// track puts backend i in the bucket of requests. Call with mu held.
func (pr *pruner) track(i int, requests int64) {
	for len(pr.key) <= i {
		pr.key = append(pr.key, noBackend)
		pr.prev = append(pr.prev, noBackend)
		pr.next = append(pr.next, noBackend)
	}
	if pr.key[i] >= 0 {
		pr.untrack(i)
	}
	k := int32(min(max(requests, 0), maxBucket))
	for len(pr.head) <= int(k) {
		pr.head = append(pr.head, noBackend)
		pr.tail = append(pr.tail, noBackend)
	}
	pr.key[i], pr.prev[i], pr.next[i] = k, pr.tail[k], noBackend
	if t := pr.tail[k]; t >= 0 {
		pr.next[t] = int32(i)
	} else {
		pr.head[k] = int32(i)
	}
	pr.tail[k] = int32(i)
	pr.low = min(pr.low, int(k))
	pr.total += int64(k)
}

// untrack takes backend i out of its bucket. Call with mu held.
func (pr *pruner) untrack(i int) {
	k := pr.key[i]
	p, n := pr.prev[i], pr.next[i]
	if p >= 0 {
		pr.next[p] = n
	} else {
		pr.head[k] = n
	}
	if n >= 0 {
		pr.prev[n] = p
	} else {
		pr.tail[k] = p
	}
	pr.key[i] = noBackend
	pr.total -= int64(k)
}

// least appends to dst the indexes of up to k of cands in mine with the
// fewest requests in flight (in a burst behind replicas, the replica's
// lane, where it would otherwise find few of its own among the fleet's
// least loaded). A backend found with a count other than its bucket's
// is moved to its bucket and looked at again there. Call with mu held.
func (pr *pruner) least(dst []int32, cands []*fleet.Backend, at *positions, mine lane, k int) []int32 {
	found := 0
	for pr.low < len(pr.head) && pr.head[pr.low] < 0 {
		pr.low++
	}
	for key := pr.low; key < len(pr.head) && found < k; key++ {
		for i := pr.head[key]; i >= 0 && found < k; {
			next := pr.next[i]
			j := at.find(cands, int(i))
			if j < 0 || !mine.has(int(i)) {
				i = next
				continue
			}
			if r := int32(min(max(pr.count(cands[j]), 0), maxBucket)); r != pr.key[i] {
				// Moved up, it comes round again in its bucket; moved
				// down (a request ended with no settle yet), it is taken
				// now: its bucket is behind us.
				pr.track(int(i), int64(r))
				if r > int32(key) {
					i = next
					continue
				}
			}
			dst = append(dst, i)
			found++
			i = next
		}
	}
	return dst
}

// positions returns where each backend is in cands, as last found for
// model's candidates: the candidates a fleet offers for a model are the
// same backends in the same order from one request to the next, until a
// backend's health changes or the fleet does. Call with mu held.
func (pr *pruner) positions(model string, cands []*fleet.Backend) *positions {
	if pr.pos == nil {
		pr.pos = make(map[string]*positions)
	}
	at := pr.pos[model]
	if at == nil {
		if len(pr.pos) >= maxPositionSets {
			clear(pr.pos)
		}
		at = &positions{}
		pr.pos[model] = at
	}
	return at
}

// maxPositionSets bounds the models whose candidates' positions are kept.
const maxPositionSets = 64

// positions maps a backend's index to its position in a candidate list.
type positions struct {
	at []int32 // -1: not a candidate when last rebuilt
	n  int     // the list's length when last rebuilt
}

// find returns backend i's position in cands, or -1 if it is not one. A
// position that no longer holds i, or a list of another length, means the
// candidates changed: the map is rebuilt (once: then it answers exactly).
func (ps *positions) find(cands []*fleet.Backend, i int) int {
	if j, ok := ps.lookup(cands, i); ok {
		return j
	}
	ps.rebuild(cands)
	j, _ := ps.lookup(cands, i)
	return j
}

// lookup returns backend i's position in cands by the map, and whether the
// map's answer holds: i found where the map says, or not a candidate in a
// list of the length the map was built from.
func (ps *positions) lookup(cands []*fleet.Backend, i int) (int, bool) {
	j := noBackend
	if i < len(ps.at) {
		j = ps.at[i]
	}
	if j < 0 {
		return -1, ps.n == len(cands)
	}
	if int(j) < len(cands) && cands[j].Index == i {
		return int(j), true
	}
	return -1, false
}

func (ps *positions) rebuild(cands []*fleet.Backend) {
	n := 0
	for _, b := range cands {
		n = max(n, b.Index+1)
	}
	ps.at = slices.Grow(ps.at[:0], n)[:n]
	for i := range ps.at {
		ps.at[i] = noBackend
	}
	for j, b := range cands {
		ps.at[b.Index] = int32(j)
	}
	ps.n = len(cands)
}
