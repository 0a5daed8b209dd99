package kvroute

import (
	"math"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// Split is kvroute's per-request prefill/decode decision, priced in
// seconds (docs/decisions/0020-priced-pd-split.md): a request goes through
// the prefill pool only when that finishes sooner, counting everyone it
// delays, than prefilling it on the decode server the policy picked.
//
//	whole = TTFT on the decode server (its cached prefix and queue)
//	      + its uncached prefill × the streams decoding there × a quarter
//	        (every step that carries a prefill chunk is that much longer
//	        for them; weighed as kvroute's cost weighs that stall,
//	        decode.go)
//	split = the prefill server's queue + its step overhead and the
//	        prompt's prefill there
//	      + the KV transfer (prompt tokens × KV bytes per token / link)
//	      + one decode step to join the decode server's batch
//
// It takes the prefill server with the lowest split price. Safe for
// concurrent use.
type Split struct {
	// PrefillRate is a server's prefill speed in tokens/s; 0 means the
	// policy's prior (30k tokens/s: an H100 with an 8B model).
	PrefillRate float64
	// KVBytesPerToken is the model's KV cache per token; 0 means
	// DefaultKVBytesPerToken.
	KVBytesPerToken float64
	// LinkBandwidth is the KV transfer's bandwidth in bytes/s; 0 means
	// DefaultLinkBandwidth.
	LinkBandwidth float64
	// Step is a decode step's time, the wait to join a batch; 0 means
	// DefaultDecodeStep.
	Step time.Duration
}

// Defaults of Split: Llama-3.1-8B in bf16 (2 × 32 layers × 8 KV heads ×
// 128 dims × 2 bytes), RDMA at 200 Gb/s, and the emulator's lone decode
// step.
const (
	DefaultKVBytesPerToken = 128 << 10
	DefaultLinkBandwidth   = 25e9
	DefaultDecodeStep      = 8 * time.Millisecond
)

var _ router.SplitPricer = (*Split)(nil)

// Name implements router.Splitter.
func (*Split) Name() string { return "priced" }

// Split implements router.Splitter.
func (s *Split) Split(req *router.Request, d *router.Decision, prefills []*fleet.Backend, intN func(int) int) *fleet.Backend {
	whole := s.wholePriceOf(req, d)
	var best *fleet.Backend
	bestPrice, ties := 0.0, 0
	for _, p := range prefills {
		price := s.splitPrice(req, p)
		switch {
		case best == nil || price < bestPrice:
			best, bestPrice, ties = p, price, 1
		case price == bestPrice:
			ties++
			if intN(ties) == 0 {
				best = p
			}
		}
	}
	if best == nil || bestPrice >= whole {
		return nil
	}
	return best
}

// SplitTTFT implements router.SplitPricer: the lowest split price over
// prefills, which kvroute's pick weighs against each decode candidate's
// whole price (price.go).
func (s *Split) SplitTTFT(req *router.Request, prefills []*fleet.Backend) time.Duration {
	best := math.Inf(1)
	for _, p := range prefills {
		best = min(best, s.splitPrice(req, p))
	}
	if math.IsInf(best, 1) {
		return 0
	}
	return seconds(best)
}

// SplitPrices returns the two prices of req, in seconds: whole on d's
// backend and split through p, for the decision records and tests.
func (s *Split) SplitPrices(req *router.Request, d *router.Decision, p *fleet.Backend) (whole, split float64) {
	return s.wholePriceOf(req, d), s.splitPrice(req, p)
}

func (s *Split) rate() float64 {
	if s.PrefillRate > 0 {
		return s.PrefillRate
	}
	return priorRate
}

// wholePriceOf is the request's TTFT on the decode server plus the delay its
// prefill adds to the streams decoding there.
func (s *Split) wholePriceOf(req *router.Request, d *router.Decision) float64 {
	uncached := max(req.PromptTokens-d.Cached, 0)
	ttft := d.PredictedTTFT.Seconds()
	if ttft <= 0 { // a policy that predicts nothing: the queue the router counts there
		ttft = float64(d.Backend.Load().PrefillTokens+int64(uncached)) / s.rate()
	}
	return wholePrice(ttft, uncached, d.Backend.Load().Decoding, s.rate())
}

// wholePrice is a request's whole price on a decode server where its TTFT
// is ttft seconds, uncached of its tokens are to prefill at rate tokens/s
// and decoding streams wait for them. kvroute's pick prices with it which
// candidates the splitter would split (price.go).
func wholePrice(ttft float64, uncached int, decoding int64, rate float64) float64 {
	return ttft + e2eDelay.stall*float64(decoding)*float64(uncached)/rate
}

// splitPrice is the request's TTFT through prefill server p: its queue,
// a step's overhead and the prompt's prefill there, the KV transfer and a
// decode step.
func (s *Split) splitPrice(req *router.Request, p *fleet.Backend) float64 {
	queued := float64(p.Load().PrefillTokens) / s.rate()
	return queued + priorOverhead + float64(req.PromptTokens)/s.rate() + s.transfer(req.PromptTokens) + s.step()
}

// transfer is the time to move n tokens' KV over the link.
func (s *Split) transfer(n int) float64 {
	kv, bw := s.KVBytesPerToken, s.LinkBandwidth
	if kv <= 0 {
		kv = DefaultKVBytesPerToken
	}
	if bw <= 0 {
		bw = DefaultLinkBandwidth
	}
	return float64(n) * kv / bw
}

func (s *Split) step() float64 {
	if s.Step > 0 {
		return s.Step.Seconds()
	}
	return DefaultDecodeStep.Seconds()
}
