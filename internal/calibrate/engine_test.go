package calibrate

import (
	"math"
	"math/rand/v2"
	"testing"
)

// request is one synthetic request's load, as the router would see it.
type request struct {
	uncached float64 // uncached prompt tokens, thousands
	running  float64 // requests running on the backend
	waiting  float64 // requests waiting there
}

// draw returns a request: prompts log-uniform from 50 to 20k uncached
// tokens, so TTFTs span two decades as they do in chat traffic.
func draw(rng *rand.Rand) request {
	return request{
		uncached: 0.05 * math.Exp(rng.Float64()*math.Log(400)),
		running:  float64(rng.IntN(8)),
		waiting:  float64(rng.IntN(4)),
	}
}

// builtin is the stand-in for the built-in engine model, the prior: 20 ms
// and 30k tokens/s, blind to batching and to the queue.
func (r request) builtin() float64 { return 0.02 + r.uncached/30 }

// noise returns a multiplicative log-normal factor of log-sd sigma.
func noise(rng *rand.Rand, sigma float64) float64 { return math.Exp(sigma * rng.NormFloat64()) }

// An engine is a synthetic truth: the median latency of a request.
type engine func(request) float64

// linear is an engine slower than the prior believes (25k tokens/s, 30 ms
// overhead) that also charges 50 ms per waiting request.
func linear(speed float64) engine {
	return func(r request) float64 { return (0.03 + 0.04*r.uncached + 0.05*r.waiting) * speed }
}

// batchSlowdown is the prior's prefill, slowed by 30 % per running request:
// up to 3.1× at a batch of 7, which the prior ignores.
func batchSlowdown(r request) float64 { return r.builtin() * (1 + 0.3*r.running) }

// Feature layouts the tests use: the router's, cut to what each engine
// needs.
func linearFeatures(r request) []float64 {
	return []float64{1, r.builtin(), r.uncached, r.waiting}
}

func batchFeatures(r request) []float64 {
	return []float64{1, r.builtin(), r.uncached, r.running, r.uncached * r.running}
}

// play observes n requests on backend i of m with engine e and noise sigma,
// predicting each first, and returns the samples: the Model's, and the
// prior's alone (feature 1, without an interval) on the same requests.
func play(m *Model, i int, e engine, features func(request) []float64, rng *rand.Rand, sigma float64, n int) (calibrated, prior []Sample) {
	for range n {
		r := draw(rng)
		x := features(r)
		p := m.Predict(i, x)
		y := e(r) * noise(rng, sigma)
		calibrated = append(calibrated, Sample{Predicted: p.Mean, Lo: p.Lo, Hi: p.Hi, Observed: y})
		prior = append(prior, Sample{Predicted: x[1], Observed: y})
		m.Observe(i, x, y)
	}
	return calibrated, prior
}

func mustNew(t testing.TB, cfg Config) *Model {
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
