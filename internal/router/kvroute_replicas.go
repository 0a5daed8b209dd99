package router

import (
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/fleet"
)

// Several router replicas behind a random (L4) split each route a share of
// the traffic with their own prefix index and their own counts of the work
// in flight. Left alone, each believes the fleet to be 1/M as loaded as it
// is, so bursts from several replicas land on the same "idle" backend, and
// each places a new prefix on its own idea of the best backend, so the next
// request for it, reaching another replica, misses. With
// KVRouteConfig.Replicas = M, kvroute degrades gracefully instead:
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
//     the best, and different sessions spread evenly;
//   - under the e2e objectives it prices a request's own stream but not
//     its delay to the streams in flight (kvroute_decode.go, stream), and
//     places by the cost without the stream (placed).

// placementSlack is how much dearer, in predicted seconds, a backend may be
// and still be where a replica places a session it has not seen: wider
// than the tie tolerance, so that replicas whose views differ by a cached
// system prompt still agree, yet small beside a long prompt's prefill, so
// that a one-request session is not sent somewhere much slower. Measured
// with `kvroute sim --routers` (docs/BENCHMARKS.md): 150 ms keeps most of a
// conversation's turns together on a chat workload; a relative slack (half
// the best cost) kept as many but lengthened Mooncake's prefill-bound TTFTs.
const placementSlack = 0.15 // s

// load returns b's in-flight work as this replica counts it, scaled to the
// whole fleet's traffic: its own count plus what the other replicas last
// reported (KVRouteConfig.PeerMaxAge), and for each replica that has not
// reported, its own count once more. peer is the reported part of the
// prefill: work this replica's queue model (drain) never saw, added to the
// queue wait as computing since the report.
func (p *KVRoute) load(b *fleet.Backend, now time.Time) (l fleet.Load, peer peerPrefill) {
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

// placementKey is what replicas agree on for req: its session key, else its
// first prompt block; 0 (the cheapest, at random among near-ties) for a
// single router.
func (p *KVRoute) placementKey(req *Request, hashes []uint64) uint64 {
	switch {
	case p.cfg.Replicas <= 1:
		return 0
	case req.SessionKey != "":
		return xxhash.Sum64String(req.SessionKey) | 1
	case len(hashes) > 0:
		return hashes[0] | 1
	}
	return 0
}

// placeByKey returns, among the candidates whose cost is within the
// placement slack of the best, the one that rendezvous hashing of key ranks
// first: the same for every replica that sees the same costs, and for most
// that see nearly the same.
func placeByKey(cand []candidate, cands []*fleet.Backend, best int, key uint64) int {
	first := best
	for i := range cand {
		if placed(&cand[i]) < placed(&cand[first]) {
			first = i
		}
	}
	limit := placed(&cand[first]) + placementSlack
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
// session's first turns (chat, 16 backends, 4 replicas: 68 % of prompt
// tokens cached against 76 % for the TTFT objective; docs/BENCHMARKS.md).
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
