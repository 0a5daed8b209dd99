package kvroute

import (
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/calibrate"
	"github.com/kvroute/kvroute/internal/fleet"
)

// The calibrated TTFT. The terms of price.go are a model of vLLM's engine;
// an engine that behaves otherwise (steps that slow with the batch, a fixed
// cost per request, a queue for batch slots, a slower GPU) is learned from
// what its requests' first tokens took, per backend, shrunk toward the
// fleet's fit (package calibrate):
//
//	TTFT(b) = θ_b · (1, model(b), uncached/1k, running/10, slot wait(b), kv use, uncached/1k × running/10)
//
// model(b) is the engine model's prediction (the terms' TTFT), so that
// θ = (0, 1, 0, …), the prior, trusts it; running is the router's count of
// the requests in flight there; slot wait what a request would wait for a
// batch slot if the engine ran no more at once than the most it has been
// seen running (batchSeen: its max_num_seqs once it has filled its batch,
// which no vLLM metric states), a mean request lifetime per batch's worth
// ahead (slotWait), which the prior does not trust and the fit weighs as
// the engine's first tokens show; kv use the context they hold over the
// backend's KV capacity. The GPU's utilisation, where a DCGM exporter
// reports it (fleet.Metrics.GPUUtil), is not a feature: a busy share over
// the last scrape says less than the router's own counts of now, and as a
// feature it made the fit's error worse on every engine profile tried
// (docs/BENCHMARKS.md, Predictions on engines of other shapes).
//
// The cost prices the calibrated TTFT in place of the model's while it is
// the more accurate of the two over the fleet's recent first tokens
// (selector): on the engine the model describes, a fit of seven features to
// a few hundred noisy requests only adds its own error, and the model
// stays; on an engine it does not describe, the fit's error falls far
// below the model's, and the fit prices. Either way the prediction the
// request is routed on is the one reported (Decision.PredictedTTFT).

// The features' indexes.
const (
	featConst = iota
	featModel
	featUncached
	featRunning
	featSlotWait
	featKV
	featBatchPrefill
	calDims
)

// features returns the calibration's features for a candidate whose
// engine-model TTFT is model seconds, with uncached prompt tokens to
// compute, load l, KV capacity kv tokens, the wait for a batch slot if the
// engine runs no more than it has been seen to (seconds).
func features(model, uncached float64, l fleet.Load, kv, wait float64) [calDims]float64 {
	running := float64(l.Requests)
	var x [calDims]float64
	x[featConst] = 1
	x[featModel] = model
	x[featUncached] = uncached / 1000
	x[featRunning] = running / 10
	x[featSlotWait] = wait
	x[featKV] = float64(l.DecodeTokens) / kv
	x[featBatchPrefill] = x[featUncached] * x[featRunning]
	return x
}

// calibration is what the policy learns of its predictions: the calibrated
// TTFT model and the alarm for a cache signal that does not hold.
type calibration struct {
	ttft *calibrate.Model
	// prior scores the engine model alone: a one-feature fit held at the
	// model (θ = 1), for the interval of its predictions.
	prior *calibrate.Model
	sel   selector
	cache *calibrate.CacheSignal
	// off: price and predict with the engine model alone
	// (Config.NoCalibration).
	off bool
	// now is the policy's clock and start when the policy began: the logs
	// say how long after the start a cache signal changed.
	now   func() time.Time
	start time.Time
	// batches watches each backend's batch, by backend index (batchSeen);
	// replaced, pointers copied, when the fleet grows.
	batches atomic.Pointer[[]*batchWatch]
}

func (c *calibration) init(cfg Config, n int) {
	prior := make([]float64, calDims)
	prior[featModel] = 1
	m, err := calibrate.New(calibrate.Config{Dim: calDims, Prior: prior})
	if err != nil {
		panic(err) // the configuration is the package's own constants
	}
	m.Grow(n)
	c.ttft = m
	held := 1e9 // observations: the data never moves it
	if c.prior, err = calibrate.New(calibrate.Config{Dim: 1, Prior: []float64{1}, Ridge: held, Shrink: held}); err != nil {
		panic(err)
	}
	c.prior.Grow(n)
	c.cache = calibrate.NewCacheSignal(calibrate.CacheSignalConfig{Now: cfg.Now})
	c.now, c.start = cfg.Now, cfg.Now()
	c.off = cfg.NoCalibration
	c.batches.Store(newBatchWatches(nil, n))
}

// grow makes room for n backends and starts those in gone afresh.
func (c *calibration) grow(n int, gone []int) {
	c.ttft.Grow(n)
	c.prior.Grow(n)
	// A new slice, fresh watches for the backends gone: a pick still
	// reading the old watch of one of them must not see it rewritten.
	ws := *newBatchWatches(*c.batches.Load(), n)
	for _, i := range gone {
		c.ttft.Reset(i)
		c.prior.Reset(i)
		if tr := c.cache.Reset(i); tr.Changed() {
			c.logCacheTransition(tr)
		}
		ws[i] = &batchWatch{}
	}
	c.batches.Store(&ws)
}

// batchSeen returns the most requests backend b's engine has been seen
// running at once in its scraped metrics (m, nil when none are fresh), or
// its slots where it reports them (llama.cpp); 0 before any scrape; and
// whether that is its batch (batchWatch). An engine that has filled its
// batch has shown its max_num_seqs; before that, requests past the most it
// has run are still the ones that may wait, and the calibration learns from
// their first tokens whether they do.
func (c *calibration) batchSeen(b *fleet.Backend, m *fleet.Metrics) (seen int, full bool) {
	batches := *c.batches.Load()
	if b.Index >= len(batches) {
		return 0, false
	}
	if m != nil && m.Slots > 0 {
		return m.Slots, true
	}
	w := batches[b.Index]
	if m != nil && w.at.Load() != m.At.UnixNano() {
		w.count(m)
	}
	v := w.state.Load()
	return int(v & seenMask), v&seenFull != 0
}

// batchWatch learns whether a vLLM-like engine caps its batch, which no
// vLLM metric states: one that does runs exactly its max_num_seqs whenever
// requests wait with KV to spare; one that does not has requests wait only
// for prefill budget (a long prompt's chunks) or memory, at whatever number
// running. So the batch is taken as full once most scrapes that show
// requests waiting, KV to spare, show the most ever seen running.
type batchWatch struct {
	state atomic.Int32 // the most seen running, with seenFull once it is the batch
	at    atomic.Int64 // the last scrape counted, Unix nanoseconds
	mu    sync.Mutex
	// waited and atMost are decayed counts of the scrapes with requests
	// waiting beside KV to spare, and of those at the most seen running.
	waited, atMost float64
}

// A batchWatch's state holds the most requests seen running, and seenFull
// once that is the engine's batch.
const (
	seenFull = 1 << 30
	seenMask = seenFull - 1
)

// Requests waiting beside KV use above slotsKVFull wait for memory, which
// kvWait prices. A batch is full after three scrapes with requests waiting
// (batchScrapes, as their decayed count has it), batchShare of them at the
// most seen running; counts decay by batchDecay a scrape, so that a
// restarted engine is learned again.
const (
	slotsKVFull  = 0.9
	batchScrapes = 2.9
	batchShare   = 0.8
	batchDecay   = 1 - 1.0/32
)

// count counts the scrape m, once.
func (w *batchWatch) count(m *fleet.Metrics) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at := m.At.UnixNano()
	if w.at.Load() == at {
		return
	}
	w.at.Store(at)
	seen := w.state.Load() & seenMask
	if r := int32(m.Running); r > seen {
		seen, w.waited, w.atMost = r, 0, 0 // a new most: what was counted was below it
	}
	if m.Waiting > 0 && m.KVUsage >= 0 && m.KVUsage < slotsKVFull {
		w.waited = w.waited*batchDecay + 1
		w.atMost *= batchDecay
		if int32(m.Running) == seen {
			w.atMost++
		}
	}
	v := seen
	if w.waited >= batchScrapes && w.atMost >= batchShare*w.waited {
		v |= seenFull
	}
	w.state.Store(v)
}

// newBatchWatches returns watches for n backends (or as many as old has),
// old's first.
func newBatchWatches(old []*batchWatch, n int) *[]*batchWatch {
	n = max(n, len(old))
	ws := make([]*batchWatch, n)
	copy(ws, old)
	for i := len(old); i < n; i++ {
		ws[i] = &batchWatch{}
	}
	return &ws
}

// observe teaches the model a streamed request's TTFT, and the alarm what
// its backend reported cached of what the index predicted (cached -1: the
// engine reported no count).
func (c *calibration) observe(b int, x *[calDims]float64, ttft float64, predicted, cached int) {
	if ttft > 0 {
		c.sel.observe(ttft, x[featModel], c.ttft.Predict(b, x[:]).Mean, !c.off)
		c.ttft.Observe(b, x[:], ttft)
		c.prior.Observe(b, x[featModel:featModel+1], ttft)
	}
	tr, fleetTr := c.cache.Observe(b, predicted, cached)
	if tr.Changed() {
		c.logCacheTransition(tr)
	}
	if fleetTr.Changed() {
		c.logCacheTransition(fleetTr)
	}
}

// predict returns candidate b's predicted TTFT with its interval, and
// whether it is the calibrated one, from its features x.
func (c *calibration) predict(b int, x *[calDims]float64) (calibrate.Prediction, bool) {
	if !c.off && c.sel.calibrated.Load() {
		return c.ttft.Predict(b, x[:]), true
	}
	model := x[featModel]
	pr := c.prior.Predict(b, x[featModel:featModel+1])
	// The interval is the model's recent errors around the model itself.
	scale := model / pr.Mean
	return calibrate.Prediction{Mean: model, Lo: min(pr.Lo*scale, model), Hi: max(pr.Hi*scale, model)}, false
}

// selector chooses, from the fleet's recent first tokens, which predicts
// better: the calibrated fit or the engine model alone. Each one's error is
// its mean |log(observed/predicted)| over the last selectMemory streams;
// the fit takes over when its error is under selectMargin of the model's
// and selectGap below it, and hands back when it is no longer under the
// model's.
type selector struct {
	mu         sync.Mutex
	model, fit float64 // decayed sums of the errors
	n          float64 // decayed count
	calibrated atomic.Bool
}

const (
	selectMemory = 200.0 // streams
	selectMargin = 0.8
	selectLeast  = 50.0 // streams before the fit may take over
	selectGap    = 0.02 // mean |log error|: 2 % closer, not a rounding error closer
)

// observe counts a stream's first token y against what the model and the
// fit predicted; logs say when the choice changes, where it is used (use).
func (s *selector) observe(y, model, fit float64, use bool) {
	if !(y > 0) || !(model > 0) || !(fit > 0) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	decay := 1 - 1/selectMemory
	s.model = s.model*decay + math.Abs(math.Log(y/model))
	s.fit = s.fit*decay + math.Abs(math.Log(y/fit))
	s.n = s.n*decay + 1
	on := s.calibrated.Load()
	switch {
	case !on && s.n >= selectLeast && s.fit < selectMargin*s.model && (s.model-s.fit)/s.n > selectGap:
		s.calibrated.Store(true)
		if !use {
			return
		}
		slog.Info("kvroute: the calibrated TTFT predicts the engines better than the engine model; it prices from now on",
			slog.Float64("model_log_error", s.model/s.n), slog.Float64("calibrated_log_error", s.fit/s.n))
	case on && s.fit >= s.model:
		s.calibrated.Store(false)
		if !use {
			return
		}
		slog.Info("kvroute: the engine model predicts the engines as well as the calibrated TTFT again; it prices from now on",
			slog.Float64("model_log_error", s.model/s.n), slog.Float64("calibrated_log_error", s.fit/s.n))
	}
}

// cacheDead reports whether the cached tokens backend b reports have
// persistently fallen short of what the index predicted there, or the
// fleet's have: affinity buys nothing there, and pricing it would only make
// hot spots.
func (c *calibration) cacheDead(b int) bool {
	return c.cache.FleetState() == calibrate.CacheDead || c.cache.State(b) == calibrate.CacheDead
}

// logCacheTransition logs a change of a cache signal's state, once per
// change, with how long after the policy's start it came.
func (c *calibration) logCacheTransition(tr calibrate.CacheTransition) {
	after := slog.Duration("after", c.now().Sub(c.start))
	who := slog.Int("backend", tr.Backend)
	if tr.Backend == calibrate.Fleet {
		who = slog.String("backend", "fleet")
	}
	if tr.To == calibrate.CacheOK {
		slog.Info("kvroute: the engines' cached tokens match the prefix index again; affinity is priced again",
			who, after, slog.String("from", tr.From.String()), slog.Float64("reported_over_predicted", tr.Ratio))
		return
	}
	slog.Warn("kvroute: the cached tokens the engines report do not match the prefix index's predictions; affinity is no longer priced there (prefix caching off, a chat template or tokenizer the index does not match, or an engine that does not report usage.prompt_tokens_details.cached_tokens; see docs/operations.md)",
		who, after, slog.String("state", tr.To.String()), slog.Float64("reported_over_predicted", tr.Ratio))
}

var cacheSignalDesc = prometheus.NewDesc("kvroute_cache_signal_state",
	`Whether the cached prompt tokens a backend reports agree with what kvroute's prefix index predicted there: 1 for the backend's current state ("ok", "dead": reported far below predicted, so affinity is not priced there; "unreported": the engine reports no cached_tokens), 0 for the others. backend="" is the fleet's verdict.`,
	[]string{"backend", "state"}, nil)

// Describe implements prometheus.Collector.
func (p *Policy) Describe(ch chan<- *prometheus.Desc) {
	ch <- cacheSignalDesc
	ch <- adaptersInFlightDesc // lora.go
	ch <- adapterWaitsDesc
}

// Collect implements prometheus.Collector: the cache signal's state per
// backend and for the fleet.
func (p *Policy) Collect(ch chan<- prometheus.Metric) {
	states := []calibrate.CacheState{calibrate.CacheOK, calibrate.CacheDead, calibrate.CacheUnreported}
	emit := func(name string, st calibrate.CacheState) {
		for _, s := range states {
			v := 0.0
			if s == st {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(cacheSignalDesc, prometheus.GaugeValue, v, name, s.String())
		}
	}
	emit("", p.cal.cache.FleetState())
	for _, b := range p.backends() {
		emit(b.Name, p.cal.cache.State(b.Index))
	}
	p.collectAdapters(ch)
}
