package kvroute

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// Several router replicas behind a random (L4) split each route a share of
// the traffic with their own prefix index and their own counts of the work
// in flight. Left alone, each believes the fleet to be 1/M as loaded as it
// is, so bursts from several replicas land on the same "idle" backend, and
// each places a new prefix on its own idea of the best backend, so the next
// request for it, reaching another replica, misses. With
// Config.Replicas = M, kvroute degrades gracefully instead:
//
//   - it adds to its own counts the other replicas' when they report them
//     (internal/peers: every replica serves its counts and polls the
//     others'), and else scales its own by M, its expectation of the
//     fleet's load;
//   - for a request whose session it has not routed before, it does not
//     take the cheapest backend (at random among near-ties) but, among those
//     within placementSlack of the cheapest, the one that rendezvous
//     hashing of the session key (else of the prompt's first block) ranks
//     first: every replica, unaware of what the others did, then sends a
//     session's turns to the same backend while it is not much dearer than
//     the best, and different sessions spread evenly; with the engines' KV
//     events, which every replica reads alike, a backend within the slack
//     that holds much more of the prompt than the cheapest comes first,
//     and where sessions never come back (one-request sessions), a new
//     prompt goes to the cheapest (placeWithEvents, returning);
//   - under the e2e objectives it prices a request's own stream but not
//     its delay to the streams in flight (decode.go, stream), and
//     places by the cost without the stream (placed).
//
// With the engines' KV events and the others' counts exact at every pick
// (Config.PeersExact), or pushed to it as they change
// (Config.PeerPush) outside a burst, the last two are not needed:
// it adds the others' counts and decides as one router (asOne); in a burst
// behind pushed counts it keeps to a lane of the backends (inLane). Behind
// counts a poll old they are, since replicas route a burst that arrives
// within a poll before any count reaches the others.

// placementSlack is how much dearer, in predicted seconds, a backend may be
// and still be where a replica places a session it has not seen: wider
// than the tie tolerance, so that replicas whose views differ by a cached
// system prompt still agree, yet small beside a long prompt's prefill, so
// that a one-request session is not sent somewhere much slower; a relative
// slack kept as many turns together but lengthened prefill-bound TTFTs
// (docs/decisions/0012-replica-session-placement.md).
const placementSlack = 0.15 // s

// s

// load returns b's in-flight work as this replica counts it, scaled to the
// whole fleet's traffic: its own count plus what the other replicas last
// reported (Config.PeerMaxAge), and for each replica that has not
// reported, its own count once more. peer is the reported part of the
// prefill: work this replica's queue model (drain) never saw, added to the
// queue wait as computing since the report.
func (p *Policy) load(b *fleet.Backend, now time.Time) (l fleet.Load, peer peerPrefill) {
	own := b.Load()
	m := int64(p.cfg.Replicas)
	if m <= 1 {
		return own, peerPrefill{}
	}
	l = own
	unheard := m - 1
	if pl := b.PeerLoad(now, p.cfg.PeerMaxAge); pl != nil {
		l = l.Plus(pl.Load)
		peer = peerPrefill{tokens: pl.PrefillTokens, age: now.Sub(pl.At).Seconds()}
		unheard = max(0, unheard-int64(pl.Peers))
	}
	l.Requests += unheard * own.Requests
	l.PrefillTokens += unheard * own.PrefillTokens
	l.Decoding += unheard * own.Decoding
	l.DecodeTokens += unheard * own.DecodeTokens
	return l, peer
}

// fleetInFlight returns the requests in flight on the whole fleet, for
// the load bound of a pruned pick, given counted, the pruner's sum: this
// replica's own and, behind replicas, the others' last reports
// (pruner.weighPeers). For each replica that has not reported, it adds the
// heard replicas' mean once more; with no reports at all, counted is this
// replica's alone, scaled by the replicas. A full scan sums the same per
// candidate (load).
func (p *Policy) fleetInFlight(counted int64, cands []*fleet.Backend, now time.Time) int64 {
	m := int64(max(p.cfg.Replicas, 1))
	if m == 1 || len(cands) == 0 {
		return counted * m
	}
	first := cands[0].PeerLoad(now, p.cfg.PeerMaxAge)
	if first == nil {
		return counted * m
	}
	heard := min(m, int64(first.Peers)+1)
	return counted + (m-heard)*counted/heard
}

// inFlight is b's requests in flight on the whole fleet as far as this
// replica knows: its own and what the other replicas last reported.
func (p *Policy) inFlight(b *fleet.Backend) int64 {
	n := b.Load().Requests
	if pl := b.PeerLoad(p.cfg.Now(), p.cfg.PeerMaxAge); pl != nil {
		n += pl.Requests
	}
	return n
}

// peerPrefill is the prefill tokens other replicas reported queued on a
// backend, and the report's age in seconds.
type peerPrefill struct {
	tokens int64
	age    float64
}

// wait is the seconds of that prefill still ahead: the backend has been
// computing it since the report, as drain assumes of the replica's own.
func (q peerPrefill) wait(prefill func(tokens float64) float64) float64 {
	if q.tokens <= 0 {
		return 0
	}
	return max(0, prefill(float64(q.tokens))-q.age)
}

// asOne reports whether this replica decides as one router does: it is the
// only one, or it reads what every engine holds from their KV events and
// the other replicas' counts reach it before every pick
// (Config.PeersExact). Then none of what sets replicas apart is
// left: the caches it prices and the load it counts are the fleet's, and
// placing by hash or leaving the delay to others out only loses what one
// router gains (docs/decisions/0005-pushed-peer-counts.md).
// With counts a poll old it must not: the replicas route a burst arriving
// at one instant before any count reaches the others, and priced alike
// they herd (0012-replica-session-placement.md).
// Counts pushed as they change (`kvroute sim --gossip-push 500us`: a
// network delay old, never a poll) are exact but for the last half
// millisecond's picks: with arrivals spread in time, deciding as one
// router matches one router where deciding as a replica does not; in a
// burst of one instant the same push herds, for no delay is short enough
// (0005, 0001-router-replica-lanes.md).
//
// Live traffic bursts too (a client sending a batch at once), so behind
// pushed counts (Config.PeerPush) a replica decides as one router
// only outside a burst: while two of its own picks come less than the push
// delay apart, the others' picks of the same burst cannot have reached it,
// and until burstHold passes without another such pair it keeps to its
// lane given Config.Lanes (inLane), else decides as a replica.
// While some peer is polled (Config.PeersPushed), its counts are a
// poll old, and the replica decides as a replica too.
func (p *Policy) asOne(now time.Time) bool {
	one, _ := p.mode(now)
	return one
}

// mode reports whether this pick decides as one router (see asOne) and
// whether it keeps to this replica's lane (see inLane).
func (p *Policy) mode(now time.Time) (one, lanes bool) {
	switch {
	case p.cfg.Replicas <= 1:
		return true, false
	case p.cfg.Events == nil:
		return false, false
	case p.cfg.PeersExact:
		return true, false
	case p.cfg.PeerPush > 0 && (p.cfg.PeersPushed == nil || p.cfg.PeersPushed()):
		in, share := p.burst.pick(now.Sub(p.epoch), p.cfg.PeerPush)
		lanes = p.cfg.Lanes != nil && (in || share > burstyShare)
		return !in && !lanes, lanes
	}
	return false, false
}

// A burst's picks split by lanes. Behind pushed counts the replicas see
// the same fleet when a burst arrives (the counts are exact but for the
// push delay), and each routes its share of the burst before any of the
// others' picks reach it: deciding alike, they send the burst's long
// prompts to the same few servers, which one router would have spread,
// and short prompts behind them. So in a burst each keeps to a lane of its
// own: the servers whose place in the order of their addresses (setLanes)
// is, modulo the replicas, its place among the replicas' names
// (Config.Lanes). No other replica places a new prompt there in the
// burst, and within its lane it knows every pick. Only a server holding a
// good part of the prompt more than any in its lane (laneShare) draws a
// prompt out of it. Lanes by rendezvous hashing are uneven, and copies of
// the request placed greedily with one taken at random send more long
// prompts to one server, not fewer (docs/decisions/0001-router-replica-lanes.md).
//
// A replica cannot tell the first pick of a burst from a lone one, so
// where most of its picks come in bursts (burstyShare), it keeps every
// pick to its lane. Within its lane it knows every pick and decides by the
// whole cost, as one router does (placementKey), but leaves out the delay
// to the streams in flight (stream), as a replica does: priced alike by
// replicas that cannot see each other's picks, that delay sent long
// prompts together (docs/decisions/0001-router-replica-lanes.md).

// burstyShare is the share of a replica's picks coming within the push
// delay of its previous one above which it keeps every pick to its lane:
// Poisson arrivals stay far below it until a replica's picks come about
// as fast as the push (a share of 0.5 at 350 a second with the 2 ms
// default), a trace's bursts of one instant well above it. A burst's
// first pick keeps to the lane too, since it looks like a lone one
// (docs/decisions/0001-router-replica-lanes.md).
const burstyShare = 0.5

// laneShare is how much more of the prompt than any server in the lane a
// server outside it must hold to draw a burst's pick there. A half, as
// placement asks (stickyShare), kept fewer prompts cached
// (docs/decisions/0001-router-replica-lanes.md, alternatives).
const laneShare = 0.25

// laneScratch holds a pick's candidates within its lane.
type laneScratch struct {
	idx   []int
	cand  []candidate
	cands []*fleet.Backend
}

// inLane decides a burst's pick (decide: the tie-break of a pick over
// cand, given its cheapest) among the candidates in this replica's lane
// and those outside it holding laneShare of the prompt more than any in
// it; among all when it has no lane (no other replica heard) or no
// candidate in it.
func (p *Policy) inLane(s *pickScratch, mine lane, cand []candidate, cands []*fleet.Backend, best int, decide func([]candidate, []*fleet.Backend, int) int) int {
	if mine.of == 0 {
		return decide(cand, cands, best)
	}
	l := &s.lane
	l.idx = l.idx[:0]
	most := -1
	for i, b := range cands {
		if !math.IsInf(cand[i].cost, 1) && mine.has(b.Index) {
			l.idx = append(l.idx, i)
			most = max(most, cand[i].cached)
		}
	}
	if most < 0 {
		return decide(cand, cands, best)
	}
	prompt := float64(cand[best].cached) + cand[best].miss
	for i := range cand {
		if !math.IsInf(cand[i].cost, 1) && cand[i].cached > most && float64(cand[i].cached-most) >= laneShare*prompt {
			l.idx = append(l.idx, i)
		}
	}
	l.cand, l.cands = l.cand[:0], l.cands[:0]
	cheapest := 0
	for k, i := range l.idx {
		l.cand = append(l.cand, cand[i])
		l.cands = append(l.cands, cands[i])
		if cand[i].cost < l.cand[cheapest].cost {
			cheapest = k
		}
	}
	return l.idx[decide(l.cand, l.cands, cheapest)]
}

// lane is the backends a replica keeps to in a burst: those whose place
// in setLanes' order is rank, modulo of. The zero lane has every backend.
type lane struct {
	pos      []int32
	rank, of int
}

// has reports whether backend i is in the lane.
func (l lane) has(i int) bool {
	return l.of == 0 || (i < len(l.pos) && int(l.pos[i])%l.of == l.rank)
}

// lane returns this replica's lane among the replicas it hears
// (Config.Lanes), or every backend when it hears none.
func (p *Policy) lane() lane {
	self, others := p.cfg.Lanes()
	pos := p.lanePos.Load()
	if len(others) == 0 || pos == nil {
		return lane{}
	}
	rank := 0
	for _, o := range others {
		if o < self {
			rank++
		}
	}
	return lane{pos: *pos, rank: rank, of: len(others) + 1}
}

// setLanes numbers the backends in the order of their addresses' hashes
// (backendKey): the same for every replica routing to the same backends.
func (p *Policy) setLanes(backends []*fleet.Backend) {
	n := 0
	for _, b := range backends {
		n = max(n, b.Index+1)
	}
	type keyed struct {
		key uint64
		b   *fleet.Backend
	}
	order := make([]keyed, 0, len(backends))
	for _, b := range backends {
		order = append(order, keyed{backendKey(b), b})
	}
	slices.SortFunc(order, func(x, y keyed) int { return cmp.Compare(x.key, y.key) })
	pos := make([]int32, n)
	for i, k := range order {
		pos[k.b.Index] = int32(i)
	}
	p.lanePos.Store(&pos)
}

// backendKey names b alike for every replica: its address, else its name
// (the simulator's servers have none).
func backendKey(b *fleet.Backend) uint64 {
	if b.URL != nil {
		return xxhash.Sum64String(b.URL.String())
	}
	return xxhash.Sum64String(b.Name)
}

// burstHold is how long a replica behind pushed counts decides as a
// replica (in its lane, given Lanes) after its picks last came faster than
// the push: long enough to span a trace's bursts, short enough that spread
// arrivals decide as one router (docs/decisions/0001-router-replica-lanes.md).
const burstHold = 500 * time.Millisecond

// burstWatch tells a replica whether its picks come in a burst.
type burstWatch struct {
	last  atomic.Int64 // the previous pick, ns since the policy's epoch (+1: 0 is none)
	until atomic.Int64 // a burst lasts until then, ns since the epoch
	// calm is the decayed share of picks not within the delay of the
	// previous one, a float64's bits: no lock on the pick path. Zero, as
	// a replica starts, is traffic that comes in bursts (see pick).
	calm  atomic.Uint64
	picks atomic.Int64
}

// shareDecay is the weight of one pick in burstWatch's share once a
// replica has made as many: about the last sixty picks decide.
const shareDecay = 1.0 / 64

// pick records a pick at at and reports whether it is in a burst, and the
// share of the picks before it that came in bursts.
//
// Before its first pick a replica takes its traffic to come in bursts (a
// share of 1, weighed as one pick) and learns otherwise from its picks'
// mean until it has made 64, then from their decayed share: started at
// none, the replicas sent their first picks of a trace's early bursts to
// the same server (docs/decisions/0001-router-replica-lanes.md). Picks
// spread in time leave the lanes from the second on.
func (w *burstWatch) pick(at, delay time.Duration) (bool, float64) {
	prev := w.last.Swap(int64(at) + 1)
	near := prev != 0 && int64(at)+1-prev < int64(delay)
	if near {
		w.until.Store(int64(at + burstHold))
	}
	miss := 1.0
	if near {
		miss = 0
	}
	weight := max(shareDecay, 1/float64(w.picks.Add(1)+1))
	for {
		old := w.calm.Load()
		calm := math.Float64frombits(old)
		if w.calm.CompareAndSwap(old, math.Float64bits(calm+weight*(miss-calm))) {
			return int64(at) < w.until.Load(), 1 - calm
		}
	}
}

// placementKey is what replicas agree on for req: its session key, else its
// first prompt block; 0 (the cheapest, at random among near-ties) for a
// single router, for a replica that decides as one (asOne) and for a
// burst's pick in its lane (inLane).
func (p *Policy) placementKey(req *router.Request, hashes []uint64, one bool) uint64 {
	switch {
	case one:
		return 0
	case req.SessionKey != "":
		return xxhash.Sum64String(req.SessionKey) | 1
	case len(hashes) > 0:
		return hashes[0] | 1
	}
	return 0
}

// placeByKey returns where a replica places a request whose session it
// has not routed (key: placementKey). Without the engines' KV events, among the
// candidates whose cost is within the placement slack of the best, the one
// that rendezvous hashing of key ranks first: the same for every replica
// that sees the same costs, and for most that see nearly the same. With
// events (placeWithEvents), by what the engines hold.
func (p *Policy) placeByKey(cand []candidate, cands []*fleet.Backend, best int, key uint64) int {
	first := best
	for i := range cand {
		if placed(&cand[i]) < placed(&cand[first]) {
			first = i
		}
	}
	if p.cfg.Events != nil {
		return placeWithEvents(cand, cands, first, key, p.returns.conversations(p.cfg.Replicas))
	}
	return rendezvousWithin(cand, cands, first, key, placed(&cand[first])+placementSlack)
}

// placeWithEvents places a request by the engines' own account of their
// caches, which every replica reads alike. When a candidate within the
// placement slack of the cheapest (first) holds a good part of the prompt
// more than the cheapest does (stickyShare), it goes to one of those
// holding the most, by rendezvous hashing of key: a conversation's next
// turn, or a session-less prompt continuing an earlier one, stays with its
// cache whichever replica routes it, as one router keeps a session on its
// backend. Else, where sessions come back (conversations), it is placed
// by key within the slack, as without events: a new session's first turn
// then goes where every replica would send it; where they do not, by key
// among the cheapest's near-ties only (tieFloor), since every replica sees
// by the events where an earlier prompt went.
func placeWithEvents(cand []candidate, cands []*fleet.Backend, first int, key uint64, conversations bool) int {
	limit := placed(&cand[first]) + placementSlack
	most := cand[first].cached
	for i := range cand {
		if placed(&cand[i]) <= limit {
			most = max(most, cand[i].cached)
		}
	}
	prompt := float64(cand[first].cached) + cand[first].miss
	if most == cand[first].cached || float64(most-cand[first].cached) < stickyShare*prompt {
		if !conversations {
			limit = placed(&cand[first]) + tieFloor
		}
		return rendezvousWithin(cand, cands, first, key, limit)
	}
	pick := -1
	for i := range cand {
		if placed(&cand[i]) <= limit && cand[i].cached == most &&
			(pick < 0 || rendezvous(key, cands[i].Index) > rendezvous(key, cands[pick].Index)) {
			pick = i
		}
	}
	return pick
}

// returning learns, per replica, whether the traffic's sessions come
// back: the decayed share of the requests with a session key whose
// session this replica had routed before. Behind M replicas a random split
// brings a session's next turn to this one once in M, so a share s means
// about s × M of requests continue a session. Safe for concurrent use.
type returning struct {
	mu sync.Mutex
	// seen is the share, starting at 1/M: as if every request continued a
	// session, until requests say otherwise.
	seen    float64
	started bool
}

// returnDecay is the weight of one request in returning's share: about a
// hundred requests decide, so that a trace of one-request sessions is
// known as such early in a run (Mooncake's, behind 8 replicas, after 90
// requests a replica), while the first turns that open a conversational
// workload (about as many as the sessions a replica sees in one think
// time: some 45 on chat at 35 sessions a second behind 8 replicas) leave
// the share above conversationShare. A conversation of six turns split
// at random over 8 replicas brings about a quarter of its requests to a
// replica that had one of its earlier turns: s × M ≈ 2.
const returnDecay = 1.0 / 64

// conversationShare is the share of requests continuing a session above
// which the traffic counts as conversations.
const conversationShare = 0.25

// place records a request with placement key key (0: none) whose session
// this replica had or had not routed before, and reports whether to place
// it by key: it has a key and no session here.
func (r *returning) place(key uint64, hasSession bool, replicas int) bool {
	if key == 0 {
		return false
	}
	r.mu.Lock()
	if !r.started {
		r.seen, r.started = 1/float64(max(replicas, 1)), true
	}
	hit := 0.0
	if hasSession {
		hit = 1
	}
	r.seen += returnDecay * (hit - r.seen)
	r.mu.Unlock()
	return !hasSession
}

// conversations reports whether, behind replicas replicas, the sessions
// come back often enough for placement to spread new ones by the hash
// over the placement slack: conversations do (their next turns reach the
// other replicas, which must agree on where the session went, and bursts
// of new ones must not herd onto the one cheapest backend while the
// replicas' shared counts are a poll old), one-request sessions do not
// (Mooncake's: the slack only sends their long prompts up to 150 ms
// dearer; docs/decisions/0012-replica-session-placement.md).
func (r *returning) conversations(replicas int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.started || r.seen*float64(replicas) >= conversationShare
}

// stickyShare is how much more of the prompt than the cheapest holds a
// candidate must hold to draw a request there past the hash: a
// conversation's next turn finds most of its prompt where the last one
// ran, while a system prompt or a trace's first block, held by many
// backends, says nothing about where a new prompt belongs.
const stickyShare = 0.5

// rendezvousWithin returns, among the candidates whose placement cost is
// at most limit (first's is), the one rendezvous hashing of key ranks
// first.
func rendezvousWithin(cand []candidate, cands []*fleet.Backend, first int, key uint64, limit float64) int {
	pick := first
	for i := range cand {
		if placed(&cand[i]) <= limit && rendezvous(key, cands[i].Index) > rendezvous(key, cands[pick].Index) {
			pick = i
		}
	}
	return pick
}

// placed is what placement compares of a candidate: its cost without the
// stream's price. That price moves with the streams in flight there, which
// replicas count differently (scaled by M, or with peers' reports up to a
// poll old), and spans seconds where the slack is 150 ms: priced in, the
// replicas rarely agreed on the slack's candidates and scattered a
// session's first turns (docs/decisions/0012-replica-session-placement.md).
func placed(c *candidate) float64 { return c.cost - c.stream }

// rendezvous is backend i's weight for key: the candidate with the highest
// wins, the same one for every replica.
func rendezvous(key uint64, i int) uint64 {
	x := key ^ uint64(i+1)*0x9e3779b97f4a7c15
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	return x ^ x>>33
}
