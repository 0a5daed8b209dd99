package kvroute

import (
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// pickScratch is one pick's working state, taken from a pool: the buffers
// its stages fill, by candidate, and the facts each stage hands the next
// (narrow → price → choose → commit).
type pickScratch struct {
	hashes  []uint64
	matched []int
	recent  []int // blocks matched in recent
	loads   []fleet.Load
	peer    []peerPrefill // the prefill in loads the other replicas reported
	drains  []drain
	shares  []float64 // prefill seconds a second sent lately, by candidate
	inverse []float64 // mean 1/tokens of the streams in flight, by candidate
	cand    []candidate
	events  []router.KVState // by candidate, when Events is set
	stream  streamCost
	tpot    []float64        // the stream's per-token time, by candidate (goodput)
	pushed  []float64        // streams pushed over the objective, by candidate (goodput)
	one     bool             // this pick decides as one router (asOne)
	lane    laneScratch      // a burst's pick within this replica's lane
	few     []int32          // a pruned pick's backends, by index
	sub     []*fleet.Backend // and as candidates

	// Set by narrow.
	req       *router.Request
	cands     []*fleet.Backend // the candidates that can win: all, or a pruned few
	fleetSize int              // the candidates the caller offered
	now       time.Time
	lanes     bool  // this pick keeps to this replica's lane (inLane)
	mine      lane  // every backend, but in a burst behind replicas
	longest   int   // the most blocks of the prompt any candidate holds
	inFlight  int64 // the fleet's requests in flight when match counted them, else -1

	// Set by price.
	ln               *learned
	promptTokens     int
	nowS             float64 // now, in seconds since the policy's epoch
	session          int     // the session's backend index, if hasSession
	hasSession       bool
	st               *streamCost
	best             int // the cheapest candidate; after choose, the chosen one
	floor, floorTTFT float64
}

// Pick implements router.Policy in four stages over one scratch value:
// narrow to the candidates that can win, price each, choose among the
// cheapest, and commit the choice to the policy's state.
func (p *Policy) Pick(req *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	if len(cands) == 0 {
		return router.Decision{}, router.ErrNoBackend
	}
	s := p.scratch.Get().(*pickScratch)
	defer p.scratch.Put(s)
	p.narrow(s, req, cands)
	p.price(s)
	p.choose(s)
	d := p.commit(s)
	s.req, s.cands = nil, nil // the pool keeps no request alive
	return d, nil
}

// narrow hashes the prompt, keeps the candidates that can win (all, or the
// few a pruned pick scores: prune.go) with what the index holds of the
// prompt on each, and asks the engines' events what they hold.
func (p *Policy) narrow(s *pickScratch, req *router.Request, cands []*fleet.Backend) {
	if n := int(p.width.Load()); len(s.matched) < n { // the fleet grew
		s.matched, s.recent = make([]int, n), make([]int, n)
	}
	s.req = req
	s.hashes = req.PrefixHashes(s.hashes[:0], p.cfg.BlockBytes)
	s.fleetSize = len(cands)
	s.now = p.cfg.Now()
	s.one, s.lanes = p.mode(s.now)
	s.mine = lane{}
	if s.lanes {
		s.mine = p.lane()
	}
	s.cands, s.longest, s.inFlight = p.match(s, req, cands, s.mine)
	if p.cfg.Events != nil {
		s.events = slices.Grow(s.events[:0], len(s.cands))[:len(s.cands)]
		p.cfg.Events.Match(req, s.cands, s.events)
	}
}

// price reads every candidate's load and queue, and sets its predicted
// TTFT and cost (price.go); s.best is then the cheapest.
func (p *Policy) price(s *pickScratch) {
	s.ln = p.learner.snapshot()
	ratio := p.cfg.Tokens.Ratio()
	s.promptTokens = s.req.PromptTokensAt(ratio)
	bound, rate := p.readLoads(s)
	cand, backlog := p.candidates(s, s.cands, s.ln, ratio, s.promptTokens, s.nowS)
	penalty := missPenalty(p.cfg.MissPenalty, rate, s.fleetSize, backlog)
	s.st = p.stream(s.req, s, s.ln, s.promptTokens)
	s.best, s.floor, s.floorTTFT = p.cost(cand, s.cands, s.loads, s.ln, penalty, bound, s.st, s.req.SplitTTFT.Seconds(), s.promptTokens)
	s.best = forSplit(cand, s.best)
}

// readLoads reads every candidate's load, then, under the policy's lock,
// its queue model and recent prefill, the session's backend and the
// arrival rate (which it counts the request in). It returns the load bound
// and the arrival rate.
func (p *Policy) readLoads(s *pickScratch) (bound, rate float64) {
	cands := s.cands
	var total int64
	s.loads = slices.Grow(s.loads[:0], len(cands))[:len(cands)]
	s.drains = slices.Grow(s.drains[:0], len(cands))[:len(cands)]
	s.peer = slices.Grow(s.peer[:0], len(cands))[:len(cands)]
	loads := s.loads
	for i, b := range cands {
		loads[i], s.peer[i] = p.load(b, s.now)
		total += loads[i].Requests
	}
	if s.inFlight >= 0 {
		total = s.inFlight
	}
	bound = loadBound(p.cfg.LoadFactor, total, s.fleetSize)

	s.nowS = s.now.Sub(p.epoch).Seconds()
	p.mu.Lock()
	s.session, s.hasSession = p.sessions[s.req.SessionKey]
	s.hasSession = s.hasSession && s.req.SessionKey != ""
	streams := p.cfg.Objective != ObjectiveTTFT
	s.shares = slices.Grow(s.shares[:0], len(cands))[:len(cands)]
	s.inverse = slices.Grow(s.inverse[:0], len(cands))[:len(cands)]
	for i, b := range cands {
		if loads[i].PrefillTokens > 0 { // else nothing is queued there
			s.drains[i] = p.queue[b.Index]
		}
		if streams {
			s.shares[i] = p.shares[b.Index].now(s.nowS)
			s.inverse[i] = p.shares[b.Index].meanInverse()
		}
	}
	rate = p.arrivalRate(s.now)
	p.mu.Unlock()
	return bound, rate
}

// choose sets s.best to the chosen candidate: among the near-cheapest, the
// session's backend or the one holding most of the prompt (breakTie), in
// a burst within this replica's lane (inLane).
func (p *Policy) choose(s *pickScratch) {
	cand, cands := s.cand, s.cands
	if math.IsInf(cand[s.best].cost, 1) {
		// Every backend is over the bound (the slack above the mean makes
		// this impossible, short of counts changing under Pick): fall back
		// to the least loaded.
		b := router.LeastLoaded(cands, p.rand.IntN)
		for i := range cands {
			if cands[i] == b {
				s.best = i
			}
		}
		return
	}
	key := p.placementKey(s.req, s.hashes, s.one || s.lanes)
	floor, floorTTFT, session, hasSession := s.floor, s.floorTTFT, s.session, s.hasSession
	decide := func(cand []candidate, cands []*fleet.Backend, best int) int {
		return p.breakTie(cand, cands, best, floor, floorTTFT, session, hasSession, key)
	}
	if s.lanes {
		s.best = p.inLane(s, s.mine, cand, cands, s.best, decide)
	} else {
		s.best = decide(cand, cands, s.best)
	}
}

// commit returns the decision for the chosen candidate and records the
// choice: the index learns the prompt there, the queue model its prefill,
// and the learner, through the decision's Done, its outcome.
func (p *Policy) commit(s *pickScratch) router.Decision {
	chosen := s.cands[s.best]
	// The router counts the request's prefill, and the queue model adds it,
	// as if only the index's part were cached: when recent's part turns out
	// evicted, the requests routed behind it would otherwise have been told
	// the backend was seconds less busy than it is (Mooncake's 100k-token
	// prompts made the p99).
	cb := &s.cand[s.best]
	work := cb.own
	if cb.maybe > cb.sure {
		work = cb.slow * s.ln.speed.prefill(float64(s.promptTokens-cb.sure), float64(cb.sure))
	}
	l := s.loads[s.best]
	pk := picked{policy: p, req: s.req, backend: chosen, sure: cb.sure, maybe: cb.maybe,
		queued: l.PrefillTokens, decoding: l.Decoding, requests: l.Requests, kv: l.DecodeTokens, work: work,
		x: cb.x}
	d := router.Decision{
		Backend: chosen,
		Reason:  s.reason(chosen),
		// Less than the index's part when the cache signal is dead there:
		// the router then counts the whole prompt's prefill queued.
		Cached:            min(cb.sure, cb.cached),
		PredictedTTFT:     seconds(cb.ttft),
		PredictedTTFTLow:  seconds(cb.lo),
		PredictedTTFTHigh: seconds(cb.hi),
		Done:              func(o router.Outcome) { pk.done(o) }, // one allocation: pk lives in the closure
	}
	if st := &s.stream; st.on {
		// As learnDecode will observe it: amid the KV there now, the
		// prompt's and half the stream's own.
		d.PredictedITL = seconds(cb.decodeSlow * st.fit.perToken(float64(l.DecodeTokens)+float64(s.promptTokens)+st.out/2, float64(l.Requests)+1, st.shares[s.best]))
	}
	if !p.cfg.NoScores {
		d.Scores = explain(s.cand, s.cands, s.best)
	}
	p.countAdapter(s.req, &d, cb.adapter)
	p.index.Insert(chosen.Index, s.hashes)
	p.prune.routed(chosen)
	p.mu.Lock()
	p.queue[chosen.Index] = drain{work: cb.queued + work, at: s.nowS}
	pk.routed = p.shares[chosen.Index].routed
	p.shares[chosen.Index].add(s.nowS, work)
	if s.st.on {
		pk.inverse = 1 / max(1, s.st.out)
		p.shares[chosen.Index].inverse += pk.inverse
		p.shares[chosen.Index].streams++
	}
	if key := s.req.SessionKey; key != "" {
		if len(p.sessions) >= maxSessions {
			clear(p.sessions)
		}
		p.sessions[key] = chosen.Index
	}
	p.mu.Unlock()
	return d
}

// reason says in a word why chosen was chosen: it holds the longest prefix,
// the prefix spilled off its holders, it is the session's backend, or it
// was the cheapest.
func (s *pickScratch) reason(chosen *fleet.Backend) (reason string) {
	switch {
	case s.longest > 0 && s.matched[chosen.Index] == s.longest:
		reason = "prefix"
	case s.longest > 0:
		reason = "spill"
	case s.hasSession && chosen.Index == s.session:
		reason = "session"
	default:
		reason = "least-cost"
	}
	return reason
}
