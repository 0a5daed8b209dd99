package kvroute

import (
	"math"
	"time"

	"github.com/kvroute/kvroute/internal/router"
)

// eventCached corrects the index's prediction of a backend's cached prompt
// tokens (sure: its tier 0; maybe: the recent tier) with what the
// backend's events say: exact events replace both, partial ones raise them
// to what they know is there. What the events count is real token ids, so
// it is not cut to the router's estimate of the prompt's length (which
// the caller bounds its uncached tokens by instead).
func eventCached(k router.KVState, sure, maybe int) (int, int) {
	t := k.Tokens
	switch {
	case k.Exact:
		return t, t
	case k.Known:
		return max(sure, t), max(maybe, t)
	}
	return sure, maybe
}

// kvroute's cost of sending a request to a backend is a sum of the terms in
// this file, each a small function with its constants beside it:
//
//	TTFT(b) = queueWait(b) + slowness(b) × speed.predict(uncached, cached, decoding)
//	          + kvWait(b) + slotWait(b)
//	cost(b) = TTFT(b) + missPenalty × own prefill(b)      (∞ over the load bound)
//
// Pick evaluates them for every candidate and breaks near-ties (tieWindow)
// towards the session's backend, then the cache.

// expectedCached blends what the index is sure a backend holds of a prompt
// (sure tokens) with what its longer memory says it probably still holds
// (maybe ≥ sure), counting the difference at the learned odds that such a
// token is still cached.
func expectedCached(sure, maybe int, odds float64) int {
	return sure + int(odds*float64(maybe-sure))
}

// recentTier is the index's tier of what backends held lately, and
// recentFactor how many times its KV capacity that tier remembers of each
// backend. Measured in the simulator on Mooncake (docs/routing.md): 2 kept
// most of what staying on a backend could gain. Until outcomes say how much
// of it was still cached, the odds are priorRecent tokens, half of them
// cached, decayed by recentDecay per observed request.
const (
	recentTier   = 1
	recentFactor = 2
	priorRecent  = 10_000.0 // tokens
	recentDecay  = 1 - 1.0/64
)

// drain is a fluid model of one backend's prefill queue: work seconds of
// prefill at the moment at (seconds since the policy's epoch), computed
// since at one second a second. The router's count of the prefill it sent
// overstates the wait as soon as the backend starts computing: a long prompt
// half done is half the wait.
type drain struct {
	work float64
	at   float64
}

// left is the queue wait term: the seconds of prefill still ahead at now on
// a backend where the prompt tokens the router sent that still await their
// first token would take most seconds to compute from scratch: never more,
// and none when none do.
func (d drain) left(now, most float64) float64 {
	return max(0, min(d.work-(now-d.at), most))
}

// missPenalty weighs a backend's prefill of the request on top of the TTFT:
// recomputing a cached prefix also delays everyone queued behind it there
// and spends cache on a second copy. It grows with the backlog every backend
// has: once the whole fleet is queued, a recomputed prefix delays each
// request that arrives behind it, about one per mean gap between arrivals
// (rate a second, spread over candidates), for as long as the least loaded
// backend's queue (backlog seconds).
func missPenalty(base, rate float64, candidates int, backlog float64) float64 {
	return base * (1 + rate/float64(candidates)*backlog)
}

// arrivalWindow is the time over which the arrival rate is averaged (a
// decayed count), in seconds.
const arrivalWindow = 30.0

// kvWait is how long a request waits for KV memory on a backend whose
// requests hold holding tokens, when it needs need more and the cache holds
// capacity: until enough of them finish, at about a cache's worth per mean
// holding time hold (seconds).
func kvWait(holding, need, capacity, hold float64) float64 {
	if excess := holding + need - capacity; excess > 0 {
		return excess / capacity * hold
	}
	return 0
}

// defaultOutput is the output expected of a request that does not say, in
// tokens: the KV it will hold beyond its prompt. Until observed, a token of
// KV is held priorHold seconds (and a request lives as long); both are
// decayed averages over 1/(1-holdDecay) requests.
const (
	defaultOutput = 256
	priorHold     = 5.0 // s
	holdDecay     = 1 - 1.0/256
)

// slotWait is how long a request waits on an engine that runs a fixed
// number of requests at once (llama.cpp's slots) and queues the rest whole:
// for as many of them to finish as are ahead of it (requests in flight there
// before it), a slot's worth per mean request lifetime life (seconds) each.
func slotWait(requests int64, slots int, life float64) float64 {
	if ahead := requests + 1 - int64(slots); ahead > 0 {
		return float64(ahead) / float64(slots) * life
	}
	return 0
}

// loadBound is the most requests any backend may have in flight after this
// one: factor times the mean over the candidates, counting this request,
// plus loadSlack. At light load, with one or two requests a backend, a slack
// of one moved conversations off their caches (chat on 32 servers: 70 % of
// prompt tokens cached against 80 % with 4).
func loadBound(factor float64, total int64, candidates int) float64 {
	return factor*float64(total+1)/float64(candidates) + loadSlack
}

const loadSlack = 4

// tieWindow returns the cost up to which a candidate ties with the best
// (cost best): the tolerance is relative to the part of the cost that
// depends on the choice (best above floor, the cheapest idle backend's
// cost), plus the prediction's own error on the request's prefill
// (floorTTFT, its TTFT on the cheapest idle backend): a long prompt's
// prefill seconds are no reason to call a half-second difference in queues
// a tie, nor is a learned speed's noise a reason to herd onto one backend.
func tieWindow(best, floor, floorTTFT float64) float64 {
	return best + max(tieFloor, tieTolerance*max(0, best-floor)+speedNoise*floorTTFT)
}

// soonestTies narrows, under the e2e objective, the ties that hold most of
// the prompt (cost within limit, most cached) to those whose first token
// comes within tieTTFT of the soonest among them; it returns how many
// they are and that TTFT bound. The stream's price widens the tie window
// by its error (streamCost.noise), seconds for a long reply, and a random
// pick within it gave away the TTFT the costs had told apart (Mooncake at
// 3× its rate, seeds 1–5, the own stream at full weight and the delay to
// the streams in flight at a quarter: TTFT p99 6.7 s at random, 5.9 s so,
// the TTFT objective's 5.8 s; goodput 81.4 → 83.5 %).
func soonestTies(cand []candidate, limit float64, most int) (ties int, by float64) {
	by = math.Inf(1)
	for i := range cand {
		if cand[i].cost <= limit && cand[i].cached == most {
			by = min(by, cand[i].ttft)
		}
	}
	by += tieTTFT
	for i := range cand {
		if cand[i].cost <= limit && cand[i].cached == most && cand[i].ttft <= by {
			ties++
		}
	}
	return ties, by
}

// tieTTFT is how much later a tie's first token may come than the
// soonest's and still tie (soonestTies): a fifth of a prefill chunk step
// on an H100 (8,192 tokens, 252 ms).
const tieTTFT = 0.05 // s

// s

// Learned speeds carry relative noise of about tieTolerance, a predicted
// prefill about speedNoise; nothing closer than tieFloor seconds is told
// apart.
const (
	tieTolerance = 0.1
	tieFloor     = 0.005 // s
	speedNoise   = 0.05
)

// slowness is a backend's observed TTFTs over what the pooled fit predicted
// for them (ratio), relative to the fleet's mean of the same ratio: a fleet is
// mostly alike, and fitting each backend alone let a few long prompts give
// one a rate far off the others' and draw every long prompt to it. Each
// backend starts as if priorSlowness seconds of TTFT had been observed
// exactly as predicted; both sums decay by slownessDecay per observation.
func slowness(ratio, mean float64) float64 {
	return ratio / mean
}

// decodeSlowness is a backend's times between tokens over what the decode
// fit predicted for them (ratio), as slowness is for TTFTs, but not over
// the fleet's mean: the decode fit follows the streams, and a slow backend
// that gets few of them would pull the others' below 1. Within
// decodeSlowBand of 1 it is 1: on a fleet of one kind of server a
// backend's ratio wanders with the load the fit does not describe (an
// engine whose steps slow with the batch), and pricing that moved streams
// for nothing (at a band of 10 %: chat-long's TTFT p99 1.6× on
// batch-slowdown, 32 users).
func decodeSlowness(ratio float64) float64 {
	if decodeBandLow < ratio && ratio < decodeBandHigh {
		return 1
	}
	return ratio
}

// decodeBandLow and decodeBandHigh are the band's bounds as ratios: a pick
// compares every candidate's ratio with them, without a logarithm.
var decodeBandLow, decodeBandHigh = math.Exp(-decodeSlowBand), math.Exp(decodeSlowBand)

// decodeSlowBand is how far, in log, a backend's decode ratio goes before
// it is priced: 0.78 to 1.28×, where GPU generations differ by 1.6× (an
// A100's memory bandwidth against an H100's) and more.
const decodeSlowBand = 0.25

// A backend's time between tokens over the decode fit's (learner.decodeSlow)
// starts as if priorDecodeSlowness seconds a token had been observed as
// predicted: twenty lone H100 steps, a stream or two's worth.
const (
	priorSlowness       = 20.0 // s
	priorDecodeSlowness = 20 * priorStep
	slownessDecay       = 1 - 1.0/500
)

// capacityShrink is what a backend's index capacity is multiplied by when
// the backend had evicted a prefix the index still believed cached; it
// regrows by 1/256 of the full capacity per prediction that held.
const capacityShrink = 0.9

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func clamp(x, lo, hi float64) float64 { return math.Max(lo, math.Min(hi, x)) }
