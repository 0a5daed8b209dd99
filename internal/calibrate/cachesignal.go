package calibrate

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// CacheState is what a backend's reported cached tokens say of the prompt
// tokens the router predicted cached there.
type CacheState int32

const (
	// CacheOK: the engine's reports confirm the predictions, or there is
	// not yet evidence to the contrary.
	CacheOK CacheState = iota
	// CacheDead: the router predicted many cached tokens and the engine
	// reported almost none. Prefix caching is off, or the engine's
	// tokenizer or chat template is not the one the index hashes, or its
	// cache is far smaller than assumed: affinity buys nothing there.
	CacheDead
	// CacheUnreported: the engine does not report cached tokens
	// (usage.cached_tokens absent) on 19 requests in 20 or more, so
	// predictions cannot be checked; it reports again at 1 in 5.
	CacheUnreported
)

// String returns "ok", "dead" or "unreported", for logs and labels.
func (s CacheState) String() string {
	switch s {
	case CacheDead:
		return "dead"
	case CacheUnreported:
		return "unreported"
	}
	return "ok"
}

// Defaults for CacheSignalConfig. At 2 requests a second to a backend, each
// predicted a few thousand cached tokens, a dead cache is called in about
// 11 s; at 0.7 a second in about 35 s: within the minute the issue asks at
// modest traffic, on evidence (20 requests, 20k tokens) no single odd
// conversation provides.
const (
	DefaultCacheWindow       = 2 * time.Minute
	DefaultCacheMinRequests  = 20.0
	DefaultCacheMinPredicted = 20_000.0 // tokens
	DefaultCacheDeadRatio    = 0.1
	DefaultCacheRecoverRatio = 0.2
)

// CacheSignalConfig configures a CacheSignal. Zero fields take their
// defaults.
type CacheSignalConfig struct {
	// Window is the time constant of the exponential decay of every sum:
	// evidence of age a weighs e^(−a/Window). Default 2 min.
	Window time.Duration
	// MinRequests and MinPredicted are the decayed counts of requests
	// predicted a cache hit, and of the tokens predicted cached in them,
	// below which no backend is called dead (or recovered). Defaults 20
	// and 20,000 tokens. MinRequests also counts, for unreported, requests
	// whose engine reported nothing.
	MinRequests, MinPredicted float64
	// DeadRatio: a backend is dead when the cached tokens its engine
	// reported, each request's capped at what was predicted, are less
	// than this share of the tokens predicted. Default 0.1.
	DeadRatio float64
	// RecoverRatio: a dead backend is ok again at this share; above
	// DeadRatio so that a backend at the edge does not flap. Default 0.2.
	RecoverRatio float64
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// CacheTransition is a change of a backend's state, or of the fleet's
// (Backend == Fleet). From == To means no change.
type CacheTransition struct {
	Backend  int
	From, To CacheState
	// Ratio is the backend's reported over predicted cached tokens (NaN
	// without predictions), or the fleet's share of dead backends.
	Ratio float64
}

// Changed reports whether the state changed: log on true, once per edge.
func (t CacheTransition) Changed() bool { return t.From != t.To }

// cacheBackend is one backend's evidence. All but state are guarded by
// CacheSignal.mu.
type cacheBackend struct {
	last       time.Time // of the last observation, to decay the sums
	active     bool      // observed since New or Reset: counted in the fleet's verdict
	requests   float64   // decayed count of requests predicted a hit and reported
	predicted  float64   // decayed tokens predicted cached in them
	confirmed  float64   // decayed tokens reported cached in them, each capped at the prediction
	reported   float64   // decayed count of requests whose engine reported cached tokens
	unreported float64   // decayed count of requests whose engine did not
	state      atomic.Int32
}

// CacheSignal watches, per backend, the prompt tokens the router predicted
// cached against the cached tokens the engine reported, and calls a
// backend dead when predictions are persistently not borne out, and the
// fleet dead when more than half of its backends (those observed since
// their last Reset) are. Observe returns transitions, each once, so the
// caller logs on the edge and not per request. States change only on
// observations; the clock is injected.
//
// Observe and Reset take a mutex; State and FleetState are lock-free reads
// for the pick path. All methods are safe for concurrent use.
type CacheSignal struct {
	cfg      CacheSignalConfig
	mu       sync.Mutex
	backends atomic.Pointer[[]*cacheBackend] // replaced, pointers copied, on growth
	count    [3]int                          // active backends by state
	active   int
	fleet    atomic.Int32
}

// NewCacheSignal returns a CacheSignal with every backend ok.
func NewCacheSignal(cfg CacheSignalConfig) *CacheSignal {
	def := func(v *float64, d float64) {
		if !(*v > 0) {
			*v = d
		}
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultCacheWindow
	}
	def(&cfg.MinRequests, DefaultCacheMinRequests)
	def(&cfg.MinPredicted, DefaultCacheMinPredicted)
	def(&cfg.DeadRatio, DefaultCacheDeadRatio)
	def(&cfg.RecoverRatio, DefaultCacheRecoverRatio)
	cfg.RecoverRatio = max(cfg.RecoverRatio, cfg.DeadRatio)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &CacheSignal{cfg: cfg}
	c.backends.Store(&[]*cacheBackend{})
	return c
}

// Observe records a finished request on backend i (≥ 0): predicted prompt
// tokens the router predicted cached there, cached the tokens the engine
// reported cached (usage.cached_tokens), or −1 when it reported none. It
// returns the backend's transition and the fleet's; log each that Changed.
// Safe for concurrent use.
func (c *CacheSignal) Observe(i, predicted, cached int) (backend, fleet CacheTransition) {
	now := c.cfg.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.grow(i + 1)[i]
	b.decay(now, c.cfg.Window)
	from := CacheState(b.state.Load())
	if !b.active {
		b.active = true
		c.active++
		c.count[from]++
	}
	switch {
	case cached < 0:
		b.unreported++
	default:
		b.reported++
		if predicted > 0 {
			b.requests++
			b.predicted += float64(predicted)
			b.confirmed += float64(min(cached, predicted))
		}
	}
	to := b.judge(from, &c.cfg)
	if to != from {
		b.state.Store(int32(to))
		c.count[from]--
		c.count[to]++
	}
	return CacheTransition{Backend: i, From: from, To: to, Ratio: b.ratio()}, c.judgeFleet()
}

// decay ages the sums to now.
func (b *cacheBackend) decay(now time.Time, window time.Duration) {
	if !b.last.IsZero() && now.After(b.last) {
		f := math.Exp(-float64(now.Sub(b.last)) / float64(window))
		b.requests *= f
		b.predicted *= f
		b.confirmed *= f
		b.reported *= f
		b.unreported *= f
	}
	if now.After(b.last) {
		b.last = now
	}
}

func (b *cacheBackend) ratio() float64 {
	if b.predicted <= 0 {
		return math.NaN()
	}
	return b.confirmed / b.predicted
}

// The share of requests whose engine reported cached tokens below which a
// backend is unreported, and above which it reports again. An engine may
// report on some responses only (say, not on streams): the gap keeps such
// a backend from flapping between the states on every report.
const (
	unreportedShare = 0.05
	reportingShare  = 0.2
)

// judge returns the backend's state on its evidence, cur when it has too
// little to change it.
func (b *cacheBackend) judge(cur CacheState, cfg *CacheSignalConfig) CacheState {
	share := b.reported / (b.reported + b.unreported)
	switch {
	case b.unreported >= cfg.MinRequests && share < unreportedShare:
		return CacheUnreported
	case cur == CacheUnreported && share < reportingShare:
		return cur
	case b.requests < cfg.MinRequests || b.predicted < cfg.MinPredicted:
		if cur == CacheUnreported {
			return CacheOK
		}
		return cur
	}
	switch r := b.ratio(); {
	case r < cfg.DeadRatio:
		return CacheDead
	case r >= cfg.RecoverRatio || cur == CacheUnreported:
		return CacheOK
	}
	return cur
}

// judgeFleet sets the fleet's state from the counts and returns its
// transition. Call with mu held.
func (c *CacheSignal) judgeFleet() CacheTransition {
	from, to := CacheState(c.fleet.Load()), CacheOK
	switch {
	case 2*c.count[CacheDead] > c.active:
		to = CacheDead
	case 2*c.count[CacheUnreported] > c.active:
		to = CacheUnreported
	}
	c.fleet.Store(int32(to))
	share := math.NaN()
	if c.active > 0 {
		share = float64(c.count[CacheDead]) / float64(c.active)
	}
	return CacheTransition{Backend: Fleet, From: from, To: to, Ratio: share}
}

// grow returns the backends, at least n of them. Call with mu held.
func (c *CacheSignal) grow(n int) []*cacheBackend {
	bs := *c.backends.Load()
	if n <= len(bs) {
		return bs
	}
	grown := make([]*cacheBackend, n, max(n, 2*len(bs)))
	copy(grown, bs)
	for i := len(bs); i < n; i++ {
		grown[i] = &cacheBackend{}
	}
	c.backends.Store(&grown)
	return grown
}

// Reset forgets backend i's evidence, for a backend that left or
// restarted: it is ok and not counted in the fleet's verdict until it is
// observed again. It returns the fleet's transition. Safe for concurrent
// use.
func (c *CacheSignal) Reset(i int) (fleet CacheTransition) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if bs := *c.backends.Load(); uint(i) < uint(len(bs)) {
		b := bs[i]
		if b.active {
			c.active--
			c.count[b.state.Load()]--
		}
		b.last, b.active = time.Time{}, false
		b.requests, b.predicted, b.confirmed, b.reported, b.unreported = 0, 0, 0, 0, 0
		b.state.Store(int32(CacheOK))
	}
	return c.judgeFleet()
}

// State returns backend i's state; ok for a backend never observed.
// Lock-free.
func (c *CacheSignal) State(i int) CacheState {
	if bs := *c.backends.Load(); uint(i) < uint(len(bs)) {
		return CacheState(bs[i].state.Load())
	}
	return CacheOK
}

// FleetState returns the fleet's verdict. Lock-free.
func (c *CacheSignal) FleetState() CacheState { return CacheState(c.fleet.Load()) }

// Ratio returns backend i's reported over predicted cached tokens in the
// window, NaN without predictions: for a gauge. Safe for concurrent use.
func (c *CacheSignal) Ratio(i int) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if bs := *c.backends.Load(); uint(i) < uint(len(bs)) {
		return bs[i].ratio()
	}
	return math.NaN()
}
