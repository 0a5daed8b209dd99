package kvroute

import (
	"math"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// breakTie returns, among the candidates whose cost is within the tie
// window of the best (tieWindow), the session's backend when it is one,
// else one of those expected to hold the most of the prompt, at random.
//
// Within the tolerance the predictions cannot tell the candidates apart, but
// the cache can: a random pick among them moved conversations off their
// prefix whenever every backend waited for KV memory (the waits make the
// tolerance seconds wide), and each move recomputed the prefix and spent
// cache on a second copy. An idle fleet, where no candidate holds more than
// another, still spreads its work at random.
func (p *Policy) breakTie(cand []candidate, cands []*fleet.Backend, best int, floor, floorTTFT float64, session int, hasSession bool, key uint64) int {
	if p.returns.place(key, hasSession, p.cfg.Replicas) {
		return p.placeByKey(cand, cands, best, key)
	}
	limit := tieWindow(cand[best].cost, floor, floorTTFT)
	ties, most := 0, -1
	for i := range cand {
		if cand[i].cost > limit {
			continue
		}
		if hasSession && cands[i].Index == session {
			return i
		}
		switch {
		case cand[i].cached > most:
			ties, most = 1, cand[i].cached
		case cand[i].cached == most:
			ties++
		}
	}
	by := math.Inf(1)
	if p.cfg.Objective == ObjectiveE2E {
		ties, by = soonestTies(cand, limit, most)
	}
	// One draw for the lot: in a large idle fleet most backends tie.
	k := p.rand.IntN(ties)
	for i := range cand {
		if cand[i].cost <= limit && cand[i].cached == most && cand[i].ttft <= by {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return best
}

// maxScores bounds the candidates a kvroute decision explains: with a
// thousand backends, a thousand scores per request would cost more to
// build than the decision and say nothing more than the cheapest few.
const maxScores = 16

// termNames are the names of a cost's terms, in the order terms.list gives
// them and LogValue logs them.
var termNames = []string{"queued", "compute", "kv_wait", "slot_wait", "adapter", "calibration", "miss", "stream"}

// list returns t as a Score's terms, named by termNames.
func (t terms) list() router.Terms {
	return router.Terms{Names: termNames, Seconds: [router.MaxTerms]float64{t.queued, t.compute, t.kvWait, t.slotWait, t.adapter, t.calibration, t.miss, t.stream}}
}

// explain returns the decision's scores: every candidate's, in order, or
// in a larger fleet the chosen one's and the cheapest others', cheapest
// first.
func explain(cand []candidate, cands []*fleet.Backend, best int) []router.Score {
	score := func(i int) router.Score {
		return router.Score{Backend: cands[i].Name, Cost: cand[i].cost, TTFT: seconds(cand[i].ttft), Cached: cand[i].cached,
			Terms: cand[i].terms.list()}
	}
	scores := make([]router.Score, 0, min(len(cands), maxScores))
	if len(cands) <= maxScores {
		for i := range cands {
			scores = append(scores, score(i))
		}
		return scores
	}
	// The cheapest others by insertion into a short sorted list: most
	// candidates cost one comparison with its last.
	var top [maxScores - 1]int
	n, worst := 0, math.Inf(1) // worst: the last kept's cost once the list is full
	for i := range cand {
		c := cand[i].cost
		if c >= worst || i == best {
			continue
		}
		j := min(n, len(top)-1)
		for j > 0 && cand[top[j-1]].cost > c {
			top[j] = top[j-1]
			j--
		}
		top[j] = i
		if n < len(top) {
			n++
		}
		if n == len(top) {
			worst = cand[top[n-1]].cost
		}
	}
	scores = append(scores, score(best))
	for _, i := range top[:n] {
		scores = append(scores, score(i))
	}
	return scores
}
