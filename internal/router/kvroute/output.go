package kvroute

import (
	"math"
	"sync"

	"github.com/kvroute/kvroute/internal/router"
)

// outputs learns how many tokens requests generate, per model, from their
// outcomes, so that kvroute can price a stream before it runs:
//
//   - a request that says max_tokens generates max_tokens × a learned
//     fraction (clients ask for more than they need, or exactly what a
//     benchmark forces);
//   - one that does not, as many as its session's earlier replies (decayed
//     mean), else as the requests of its model with prompts of about its
//     size.
//
// Each is a decayed histogram, read two ways: its mean is the expected
// stream, which the time costs take (they are linear in it), and a high
// quantile the KV the request will hold, which a KV-wait estimate must not
// undercount. It also learns how many turns sessions have, so that a
// session's turn can be priced with the turns it will bring after it.
// Safe for concurrent use.
type outputs struct {
	mu       sync.Mutex
	models   map[string]*modelOutputs
	sessions map[string]sessionOutputs
	// reached counts, decayed, the sessions that completed at least j
	// turns (the last: maxTurns or more): the odds that a session that has
	// had j turns has another.
	reached [maxTurns + 1]float64
}

// sessionOutputs is what a session's completed turns say.
type sessionOutputs struct {
	mean  float64 // decayed mean reply, tokens
	turns int     // completed turns
}

// modelOutputs is one model's learned output lengths.
type modelOutputs struct {
	fraction hist                    // completion / max_tokens, of requests that said
	free     [promptBuckets + 1]hist // completion tokens by prompt size (log2 buckets; the last: all sizes)
}

// outputEstimate is what kvroute expects of a request's stream: its mean
// length and a high quantile of it, and the mean stream of its model's
// requests (the streams it will share a backend with), in tokens.
type outputEstimate struct {
	mean, high, typical float64
	// future is the turns its session is expected to bring after it (0
	// without a session).
	future float64
}

// outputHigh is the quantile of the learned distribution taken as the KV a
// request will hold; outputPrior the tokens expected before anything is
// learned (defaultOutput), as if priorOutputs requests had generated it.
const (
	outputHigh    = 0.9
	priorOutputs  = 4.0
	outputDecay   = 1 - 1.0/512
	sessionWeight = 0.5 // of the last reply in a session's mean
	promptBuckets = 18  // log2 buckets of prompt tokens: 1 .. 128k
	maxOutSession = 1 << 16
	maxTurns      = 64
	// minReached is how many sessions must have reached a turn before the
	// odds of the turns after it are read.
	minReached = 8.0
)

func newOutputs() *outputs {
	return &outputs{models: map[string]*modelOutputs{}, sessions: map[string]sessionOutputs{}}
}

func promptBucket(tokens int) int {
	if tokens < 1 {
		return 0
	}
	return min(promptBuckets-1, int(math.Log2(float64(tokens))))
}

// expect returns the expected stream of req.
func (o *outputs) expect(req *router.Request) outputEstimate {
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.expectLocked(req)
	// A session's first turn has no future here: it has no cache of its
	// own to leave (pricing it as turn 1 changed nothing on long-gen).
	if so, ok := o.sessions[req.SessionKey]; ok && req.SessionKey != "" {
		e.future = o.remaining(so.turns + 1)
	}
	e.typical = defaultOutput
	if m := o.models[req.Model]; m != nil && m.free[promptBuckets].weight > 0 {
		e.typical = m.free[promptBuckets].mean()
	}
	return e
}

func (o *outputs) expectLocked(req *router.Request) outputEstimate {
	m := o.models[req.Model]
	if req.MaxTokens > 0 {
		n := float64(req.MaxTokens)
		if m == nil || m.fraction.weight == 0 {
			return outputEstimate{mean: n, high: n} // nothing learned: believe the request
		}
		return outputEstimate{mean: n * m.fraction.mean(), high: n * m.fraction.quantile(outputHigh)}
	}
	if so, ok := o.sessions[req.SessionKey]; ok && req.SessionKey != "" {
		mean := so.mean
		high := mean
		if m != nil {
			high = max(mean, m.free[promptBuckets].quantile(outputHigh))
		}
		return outputEstimate{mean: mean, high: high}
	}
	if m == nil {
		return outputEstimate{mean: defaultOutput, high: defaultOutput}
	}
	h := &m.free[promptBucket(req.PromptTokens)]
	if h.weight < priorOutputs {
		h = &m.free[promptBuckets]
	}
	if h.weight == 0 {
		return outputEstimate{mean: defaultOutput, high: defaultOutput}
	}
	return outputEstimate{mean: h.mean(), high: h.quantile(outputHigh)}
}

// observe learns that req generated completion tokens.
func (o *outputs) observe(req *router.Request, completion int) {
	if completion < 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.models[req.Model]
	if m == nil {
		m = &modelOutputs{}
		for i := range m.free {
			m.free[i].init(logBuckets)
		}
		m.fraction.init(fractionBuckets)
		o.models[req.Model] = m
	}
	if req.MaxTokens > 0 {
		m.fraction.add(min(1, float64(completion)/float64(req.MaxTokens)))
	}
	n := float64(completion)
	m.free[promptBucket(req.PromptTokens)].add(n)
	m.free[promptBuckets].add(n)
	if req.SessionKey != "" {
		if len(o.sessions) >= maxOutSession {
			clear(o.sessions)
		}
		so, ok := o.sessions[req.SessionKey]
		if ok {
			n = sessionWeight*n + (1-sessionWeight)*so.mean
		}
		so.mean, so.turns = n, so.turns+1
		o.sessions[req.SessionKey] = so
		for j := range o.reached {
			o.reached[j] *= outputDecay
		}
		o.reached[min(so.turns, maxTurns)]++
	}
}

// remaining returns how many turns a session expects after its turn k
// (from 1), from how many sessions reached each turn: the sum over later
// turns of the odds of reaching them. Sessions still running count as
// ended, so it errs low; it is 0 until minReached sessions reached turn k.
func (o *outputs) remaining(k int) float64 {
	if k >= maxTurns || o.reached[k] < minReached {
		return 0
	}
	var after float64
	for _, n := range o.reached[k+1:] {
		after += n
	}
	return after / o.reached[k]
}

// hist is a decayed histogram of non-negative values over fixed bucket
// upper bounds, with the decayed sum of the values for the mean.
type hist struct {
	bounds []float64
	w      []float64
	weight float64
	sum    float64
}

var (
	// fractionBuckets: 0.05 .. 1 in steps of 0.05.
	fractionBuckets = func() []float64 {
		b := make([]float64, 20)
		for i := range b {
			b[i] = float64(i+1) / 20
		}
		return b
	}()
	// logBuckets: 1 .. 128k tokens, four buckets per doubling.
	logBuckets = func() []float64 {
		var b []float64
		for x := 1.0; x <= 1<<17; x *= math.Pow(2, 0.25) {
			b = append(b, x)
		}
		return b
	}()
)

func (h *hist) init(bounds []float64) {
	h.bounds, h.w = bounds, make([]float64, len(bounds))
}

func (h *hist) add(x float64) {
	for i := range h.w {
		h.w[i] *= outputDecay
	}
	h.weight = h.weight*outputDecay + 1
	h.sum = h.sum*outputDecay + x
	i := len(h.bounds) - 1
	for j, b := range h.bounds {
		if x <= b {
			i = j
			break
		}
	}
	h.w[i]++
}

func (h *hist) mean() float64 { return h.sum / h.weight }

// quantile returns the upper bound of the bucket holding the q-quantile.
func (h *hist) quantile(q float64) float64 {
	want, acc := q*h.weight, 0.0
	for i, w := range h.w {
		acc += w
		if acc >= want {
			return h.bounds[i]
		}
	}
	return h.bounds[len(h.bounds)-1]
}
