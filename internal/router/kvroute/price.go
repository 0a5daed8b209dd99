package kvroute

import (
	"log/slog"
	"math"
	"slices"

	"github.com/kvroute/kvroute/internal/fleet"
)

// candidate is what Pick works out about one backend before costing it.
type candidate struct {
	cached int     // prompt tokens expected cached there
	sure   int     // of which the index holds
	maybe  int     // prompt tokens recent holds there
	miss   float64 // prompt tokens to compute there
	slow   float64 // its TTFTs over the fleet's, relative to the mean
	// decodeSlow is the same of its times between tokens (decode.go).
	decodeSlow float64
	queued     float64 // seconds of prefill ahead there
	own        float64 // seconds of the request's own prefill there
	// seenWait is the wait for a batch slot there if the engine ran no
	// more requests at once than the most it has been seen running.
	seenWait float64
	// batchFull: the engine has been seen to hold requests back at that
	// many running (its batch), so seenWait is a wait it will have.
	batchFull bool
	adapter   float64          // seconds to load its adapter and wait for a slot (lora.go)
	load      float64          // of which the load
	evict     float64          // the reload of the adapter its load evicts (lora.go)
	ttft      float64          // predicted TTFT there, seconds (calibrated)
	lo, hi    float64          // its prediction interval
	x         [calDims]float64 // the calibration's features (calibrate.go)
	cost      float64          // what the choice minimises
	split     float64          // its cost split, where the splitter would split there; else +Inf
	stream    float64          // of which the stream's price (decode.go)
	terms     terms            // the cost term by term, for the decision's scores
}

// candidates works out, for every candidate, the prompt tokens expected
// cached there, its slowness, the prefill queued ahead and the request's own
// prefill; and the least wait on any, for prefill queued or a batch slot
// (the fleet's backlog).
func (p *Policy) candidates(s *pickScratch, cands []*fleet.Backend, ln *learned, ratio float64, promptTokens int, nowS float64) ([]candidate, float64) {
	s.cand = slices.Grow(s.cand[:0], len(cands))[:len(cands)]
	cand := s.cand
	clear(cand)
	slow, decodeSlow := p.learner.slowRatios(), p.learner.decodeSlowRatios()
	backlog := math.Inf(1)
	for i, b := range cands {
		c := &cand[i]
		c.sure = min(promptTokens, int(float64(s.matched[b.Index]*p.cfg.BlockBytes)/ratio))
		c.maybe = max(c.sure, min(promptTokens, int(float64(s.recent[b.Index]*p.cfg.BlockBytes)/ratio)))
		if p.cfg.Events != nil {
			c.sure, c.maybe = eventCached(s.events[i], c.sure, c.maybe)
		}
		c.cached = expectedCached(c.sure, c.maybe, ln.odds)
		if p.cal.cacheDead(b.Index) {
			c.cached = 0 // the engine's cache does not hold what the index says
		}
		c.slow = slowness(math.Float64frombits(slow[b.Index].Load()), ln.meanSlow)
		c.decodeSlow = ln.decodeMix.price(b.Index, math.Float64frombits(decodeSlow[b.Index].Load()))
		c.miss = float64(max(0, promptTokens-c.cached))
		if own := s.loads[i].PrefillTokens - s.peer[i].tokens; own > 0 {
			c.queued = s.drains[i].left(nowS, c.slow*ln.speed.prefill(float64(own), 0))
		}
		c.queued += s.peer[i].wait(func(tokens float64) float64 { return c.slow * ln.speed.prefill(tokens, 0) })
		c.own = c.slow * ln.speed.prefill(c.miss, float64(c.cached))
		load, slot, evict := p.adapterWait(b, s.req.Adapter, ln.life)
		c.adapter, c.load, c.evict = load+slot, load, evict
		if p.cfg.Metrics != nil {
			if seen, full := p.cal.batchSeen(b, p.cfg.Metrics(b)); seen > 0 {
				c.seenWait = slotWait(s.loads[i].Requests, seen, ln.life)
				c.batchFull = full
			}
		}
		// A backend whose batch is full makes a request wait as surely as
		// one with prefill queued: either way, every backend busy means a
		// recomputed prefix delays the requests behind it (missPenalty).
		backlog = min(backlog, c.queued+c.seenWait)
	}
	return cand, backlog
}

// cost sets every candidate's predicted TTFT and cost (the sum of its
// terms), for a request that needs st.need tokens of KV, and returns the
// cheapest and the floor and TTFT floor of the tie window (see tieWindow).
//
// With a prefill pool priced before the pick (split, the request's TTFT
// through it in seconds, 0 without; prompt, its tokens) it also sets each
// candidate's split cost where the priced splitter would split there, for
// forSplit. The candidates' TTFT and terms stay the whole request's, which
// the splitter weighs after the pick.
func (p *Policy) cost(cand []candidate, cands []*fleet.Backend, loads []fleet.Load, ln *learned, penalty, bound float64, st *streamCost, split float64, prompt int) (best int, floor, floorTTFT float64) {
	best, floor, floorTTFT = -1, math.Inf(1), math.Inf(1)
	for i, b := range cands {
		c := &cand[i]
		t := p.terms(i, b, c, loads[i], ln, penalty, st)
		p.calibrate(c, b, &t, loads[i])
		ttft, cost := t.ttft(), t.cost()
		c.split = math.Inf(1)
		// The splitter's test at its default rate, on the cached part the
		// decision will report.
		if split > 0 && split < wholePrice(ttft, max(prompt-min(c.sure, c.cached), 0), loads[i].Decoding, priorRate) {
			c.split = st.splitCost(i, c, loads[i], t, split)
		}
		c.stream, c.terms = t.stream, t
		if float64(loads[i].Requests+1) > bound {
			cost, c.split = math.Inf(1), math.Inf(1) // over the load bound: only if all are
		}
		c.ttft, c.cost = ttft, cost
		if best < 0 || cost < cand[best].cost {
			best = i
		}
		// The cost on an idle backend: what no choice can avoid, and the
		// TTFT there, whose error makes near costs ties.
		floor = min(floor, c.slow*ln.speed.overhead+(1+penalty)*c.own+st.idle)
		floorTTFT = min(floorTTFT, c.slow*ln.speed.overhead+c.own)
	}
	best, floor = st.misses(cand, best, floor)
	return best, floor, floorTTFT + st.noise()
}

// forSplit returns the candidate for a request that the splitter will
// split at best, the whole request's cheapest: every candidate the
// splitter would split costs the cheaper way, so that the decode server is
// chosen for the split, by its batch and KV room rather than its cache. A
// request that stays whole is chosen as before: pricing it for a split too
// lowered goodput (docs/decisions/0020-priced-pd-split.md).
func forSplit(cand []candidate, best int) int {
	if math.IsInf(cand[best].split, 1) {
		return best
	}
	for i := range cand {
		cand[i].cost = min(cand[i].cost, cand[i].split)
		if cand[i].cost < cand[best].cost {
			best = i
		}
	}
	return best
}

// splitCost is candidate i's cost for a request prefilled on the prefill
// pool and decoded there: the longer of split seconds and the prefill
// queued there (the transferred request still waits its turn in the
// engine's queue), the waits for KV room, a slot and the adapter as whole
// (t), and its own stream in that batch; no recompute and no stall to the
// streams there, since its KV arrives by transfer.
func (st *streamCost) splitCost(i int, c *candidate, l fleet.Load, t terms, split float64) float64 {
	cost := max(split, t.queued) + t.kvWait + t.slotWait + t.adapter
	if st.on {
		cost += st.ownStream(i, c, l)
	}
	return cost
}

// terms is one candidate's cost, term by term, in seconds: cost sums them,
// and a debug log or a test lists them by name (LogValue).
type terms struct {
	// queued is the prefill queued ahead of the request there.
	queued float64
	// compute is the request's own time to first token on an idle queue:
	// the overhead, its uncached prefill and the decoding batch's slowdown,
	// scaled by the backend's slowness.
	compute float64
	// kvWait is the wait until the backend's KV cache has room for it.
	kvWait float64
	// slotWait is the wait for a free slot, on engines that report slots.
	slotWait float64
	// adapter is the load of the request's LoRA adapter and the wait for
	// an adapter slot there (lora.go).
	adapter float64
	// calibration is what the calibrated TTFT adds to the terms above
	// (negative where they overstate it), where it prices (calibrate.go).
	calibration float64
	// miss is MissPenalty times its prefill there: what recomputing a
	// prefix costs the requests queued behind it.
	miss float64
	// stream is the price of its stream there and of its delay to the
	// streams in flight there (decode.go).
	stream float64
}

// ttft is the predicted time to first token: the terms before miss.
func (t terms) ttft() float64 {
	return t.queued + t.compute + t.kvWait + t.slotWait + t.adapter + t.calibration
}

// cost is what the choice minimises.
func (t terms) cost() float64 { return t.ttft() + t.miss + t.stream }

// LogValue lists the terms by name.
func (t terms) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Float64("queued", t.queued), slog.Float64("compute", t.compute),
		slog.Float64("kv_wait", t.kvWait), slog.Float64("slot_wait", t.slotWait), slog.Float64("adapter", t.adapter),
		slog.Float64("calibration", t.calibration),
		slog.Float64("miss", t.miss), slog.Float64("stream", t.stream))
}

// calibrate sets t's calibration term: what the calibrated TTFT adds to the
// engine model's (none while the model predicts better: calibrate.go). It
// keeps the features and the prediction interval in c.
func (p *Policy) calibrate(c *candidate, b *fleet.Backend, t *terms, l fleet.Load) {
	model := t.ttft()
	c.x = features(model, c.miss, l, p.kvTokens(b), c.seenWait)
	pr, calibrated := p.cal.predict(b.Index, &c.x)
	c.lo, c.hi = pr.Lo, pr.Hi
	if calibrated {
		t.calibration = pr.Mean - model
	}
}

// kvTokens returns b's KV capacity in tokens: what it reports, else the
// default.
func (p *Policy) kvTokens(b *fleet.Backend) float64 {
	if info := b.Info(); info != nil && info.KVTokens() > 0 {
		return float64(info.KVTokens())
	}
	return float64(p.cfg.DefaultKVTokens)
}

// terms prices candidate i, backend b with load l, as cost sums it; c holds
// what candidates worked out about it.
func (p *Policy) terms(i int, b *fleet.Backend, c *candidate, l fleet.Load, ln *learned, penalty float64, st *streamCost) terms {
	t := terms{queued: c.queued, compute: c.slow * ln.speed.predict(c.miss, float64(c.cached), float64(l.Decoding))}
	t.kvWait = kvWait(float64(l.DecodeTokens), st.need, p.kvTokens(b), ln.hold)
	if p.cfg.Metrics != nil {
		if m := p.cfg.Metrics(b); m != nil && m.Slots > 0 {
			t.slotWait = slotWait(l.Requests, m.Slots, ln.life)
		} else if c.batchFull {
			t.slotWait = c.seenWait // a vLLM engine at its max_num_seqs queues the rest whole, as slots do
		}
	}
	t.adapter = c.adapter
	t.stream = st.cost(i, c, l) + st.adapterStall(i, c.load, c.evict, l)
	t.miss = penalty * c.own
	return t
}
