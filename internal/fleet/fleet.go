package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for Options.
const (
	DefaultScrapeInterval = time.Second
	DefaultHealthInterval = time.Second
	DefaultTimeout        = time.Second
	// DefaultFailThreshold is HAProxy's `fall` and Kubernetes' readiness
	// failureThreshold: one probe that times out is a router starved of CPU
	// for a second as often as a backend gone, and a router that drops every
	// backend on one answers 503 while all of them serve. A backend that
	// refuses connections is ejected by the requests' own failures sooner.
	DefaultFailThreshold = 3
	DefaultPassThreshold = 1
)

// staleScrapes is how many scrape intervals a backend's metrics stay
// trustworthy: past that they describe a server that has moved on.
const staleScrapes = 3

// rediscoverRounds is how many health rounds pass between re-reading a
// healthy backend's /v1/models (a model can be swapped without the server
// ever failing a health check).
const rediscoverRounds = 10

var (
	// ErrRunning is returned by Run when the fleet is already running.
	ErrRunning = errors.New("fleet: already running")
	// ErrNoModels means a backend's /v1/models listed no model.
	ErrNoModels = errors.New("backend lists no models")
	// ErrNoLoadMetrics means a backend's /metrics had none of the load
	// metrics kvroute understands (vLLM, SGLang or llama.cpp names).
	ErrNoLoadMetrics = errors.New("no known load metrics")
	// ErrBodyTooLarge means a probe's response body exceeded its limit.
	ErrBodyTooLarge = errors.New("response body too large")
)

// StatusError is a probe that a backend answered with an unexpected HTTP
// status.
type StatusError struct {
	// URL is the probed URL.
	URL string
	// StatusCode is the HTTP status the backend answered.
	StatusCode int
}

// Error implements error.
func (e *StatusError) Error() string {
	return fmt.Sprintf("GET %s: %d %s", e.URL, e.StatusCode, http.StatusText(e.StatusCode))
}

// Options configure a Fleet. The zero value gives the defaults.
type Options struct {
	// ScrapeInterval is how often /metrics is scraped (default 1s). Metrics
	// older than 3 × ScrapeInterval are stale and not reported by Metrics.
	ScrapeInterval time.Duration
	// HealthInterval is how often /health is probed (default 1s). Models are
	// re-discovered every 10 health intervals and whenever a backend comes
	// back.
	HealthInterval time.Duration
	// Timeout bounds each probe: one HTTP request, body included (default 1s).
	Timeout time.Duration
	// FailThreshold is how many consecutive failed health checks take a
	// backend out of rotation (0: 1, at once; the commands' default is
	// DefaultFailThreshold).
	FailThreshold int
	// PassThreshold is how many consecutive passed health checks bring it
	// back (default 1).
	PassThreshold int
	// Client sends the probes. Nil means a client of its own, with a
	// transport like http.DefaultTransport that keeps an idle connection to
	// every backend however large the fleet.
	Client *http.Client
	// Logger receives health transitions and probe failures; nil means
	// slog.Default().
	Logger *slog.Logger
	// Now is the clock that stamps and ages metrics and times ejections;
	// nil means time.Now.
	Now func() time.Time
	// Outlier configures outlier ejection (see Report); the zero value gives
	// Envoy's defaults.
	Outlier OutlierOptions
}

// Fleet is the set of backends kvroute routes to. It keeps their health,
// models and load metrics current (Run, Refresh) and answers the hot path's
// questions (Candidates, Metrics) without locks: every per-backend fact is
// an atomic on the Backend, and the set of backends is an immutable snapshot
// that Update replaces. A Fleet is safe for concurrent use.
type Fleet struct {
	set atomic.Pointer[memberSet]

	// mu serialises Update and guards the fields below.
	mu sync.Mutex
	// next is the Index the next added backend gets: indexes only grow, so
	// that a removed backend's requests still in flight never share an
	// index with a newcomer in a policy's per-backend state.
	next  int
	watch func([]*Backend)
	// watchLoad is every backend's load watcher (WatchLoad).
	watchLoad func(*Backend)

	scrapeEvery, healthEvery, timeout time.Duration
	failAfter, passAfter              int
	maxAge                            time.Duration
	client                            *http.Client
	log                               *slog.Logger
	now                               func() time.Time

	running atomic.Bool
	out     outliers
}

// memberSet is one immutable snapshot of the fleet's membership.
type memberSet struct {
	backends []*Backend
	members  []*member
	byPtr    map[*Backend]*member
}

func (s *memberSet) add(m *member) {
	s.backends = append(s.backends, m.b)
	s.members = append(s.members, m)
	s.byPtr[m.b] = m
}

// member is a fleet's private state for one backend: probe URLs, the health
// counters and the scrape buffers.
type member struct {
	b                                                *Backend
	base, healthURL, modelsURL, metricsURL, slotsURL string

	mu sync.Mutex // guards the fields below and changes of b's health and info
	// passes and fails count consecutive health-check outcomes.
	passes, fails int
	// passed is set once a health check has passed: until then a backend
	// goes out on its first failure (one that is down when the router
	// starts, or when discovery adds it, is not routed to for FailThreshold
	// rounds).
	passed bool
	// passive counts passive failures (MarkFailed), so that a health check
	// that was already under way when one arrived cannot undo it.
	passive uint64
	// sinceDiscovery counts health rounds since models were last read.
	sinceDiscovery int
	// discoverFailing is set while discovery fails, to log it once.
	discoverFailing bool
	// cache is the KV cache shape from the latest scrape that had one.
	cache cacheConfig

	out outlierState // has its own lock: Report never waits on health checks

	scrapeMu sync.Mutex // one scrape at a time; guards the fields below
	scraper  scraper
	// scrapeFailing is set while scrapes fail, to log it once.
	scrapeFailing bool
	// enginesNoted is set once a backend that is no rank was found to
	// serve several data-parallel engines (rank.go).
	enginesNoted bool
	// gpuFailing is the same for the backend's GPUMetricsURL.
	gpuFailing bool
}

// New returns a fleet of backends with options opts. The backends keep their
// current health (NewBackend makes them healthy) and have no Info until the
// first Refresh or health round discovers it. The slice is kept; do not
// modify it afterwards. Backends added later by Update are numbered from
// the largest Index here, plus one.
func New(backends []*Backend, opts Options) *Fleet {
	f := &Fleet{
		scrapeEvery: positive(opts.ScrapeInterval, DefaultScrapeInterval),
		healthEvery: positive(opts.HealthInterval, DefaultHealthInterval),
		timeout:     positive(opts.Timeout, DefaultTimeout),
		failAfter:   max(opts.FailThreshold, 1),
		passAfter:   max(opts.PassThreshold, 1),
		client:      opts.Client,
		log:         opts.Logger,
		now:         opts.Now,
	}
	f.out.init(opts.Outlier, len(backends))
	f.maxAge = staleScrapes * f.scrapeEvery
	if f.client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns = 0 // no fleet-wide cap: each backend keeps its own idle connections
		f.client = &http.Client{Transport: t}
	}
	if f.log == nil {
		f.log = slog.Default()
	}
	if f.now == nil {
		f.now = time.Now
	}
	set := &memberSet{backends: backends, members: make([]*member, 0, len(backends)),
		byPtr: make(map[*Backend]*member, len(backends))}
	for _, b := range backends {
		m := newMember(b)
		set.members = append(set.members, m)
		set.byPtr[b] = m
		f.next = max(f.next, b.Index+1)
	}
	f.set.Store(set)
	return f
}

func newMember(b *Backend) *member {
	return &member{
		b:          b,
		base:       b.URL.String(),
		healthURL:  b.URL.JoinPath("health").String(),
		modelsURL:  b.URL.JoinPath("v1", "models").String(),
		metricsURL: b.URL.JoinPath("metrics").String(),
		slotsURL:   b.URL.JoinPath("slots").String(),
		scraper:    scraper{engine: engineLabel(b)}, // rank.go
	}
}

// members returns the current membership snapshot.
func (f *Fleet) members() []*member { return f.set.Load().members }

// member returns b's state, or nil when b is not (or no longer) in the
// fleet.
func (f *Fleet) member(b *Backend) *member { return f.set.Load().byPtr[b] }

func positive(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Backends returns every backend in fleet order, healthy or not, as of now:
// Update may change the set at any time. The slice is shared: do not modify
// it.
func (f *Fleet) Backends() []*Backend { return f.set.Load().backends }

// Candidates appends to dst the backends in rotation (healthy, not ejected,
// not backing off) that serve model, in fleet order, and returns the
// extended slice. It is the hot path: it takes no locks and allocates
// nothing when dst has room.
func (f *Fleet) Candidates(dst []*Backend, model string) []*Backend {
	for _, m := range f.members() {
		if f.inRotation(m) && m.b.Info().Serves(model) {
			dst = append(dst, m.b)
		}
	}
	return dst
}

// Healthy appends to dst the backends in rotation (healthy, not ejected, not
// backing off), whatever they serve, in fleet order, and returns the
// extended slice. It allocates nothing when dst has room.
func (f *Fleet) Healthy(dst []*Backend) []*Backend {
	for _, m := range f.members() {
		if f.inRotation(m) {
			dst = append(dst, m.b)
		}
	}
	return dst
}

// Models returns the sorted union of the models of every backend that has
// been discovered, healthy or not.
func (f *Fleet) Models() []string {
	var models []string
	for _, b := range f.Backends() {
		if info := b.Info(); info != nil {
			models = append(models, info.Models...)
		}
	}
	slices.Sort(models)
	return slices.Compact(models)
}

// Ready reports whether at least one backend is healthy, not ejected and
// discovered, so that some request could be routed. A backoff does not make
// a backend unready: it is short, and an overloaded fleet is not a broken
// one.
func (f *Fleet) Ready() bool {
	for _, m := range f.members() {
		if b := m.b; b.Healthy() && !m.out.ejected.Load() && b.Info() != nil {
			return true
		}
	}
	return false
}

// Metrics returns b's latest scraped metrics, or nil when there are none or
// they are stale (older than 3 × ScrapeInterval by the fleet's clock). The
// result is shared and must not be modified.
func (f *Fleet) Metrics(b *Backend) *Metrics { return b.Metrics(f.now(), f.maxAge) }

// MarkFailed takes b out of rotation at once after a failure the proxy saw
// (connection refused, reset, a 5xx that means the server is gone); err is
// logged with the transition, once however many requests report it. Only a
// health check that starts after the failure can bring b back. Backends not
// in the fleet are ignored. Safe for concurrent use; it does not block on
// I/O.
func (f *Fleet) MarkFailed(b *Backend, err error) {
	m := f.member(b)
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.passive++
	m.passes = 0
	if b.SetHealthy(false) {
		f.log.Warn("backend down", "backend", b.Name, "url", m.base, "cause", "request failed", "err", err)
	}
}

// Refresh runs one round of health checks, scrapes and model discovery for
// every backend in parallel, and returns when all are done or ctx ends. Use
// it at startup, before Run, so that the fleet is Ready as soon as it can be.
func (f *Fleet) Refresh(ctx context.Context) {
	f.each(f.members(), func(m *member) {
		f.checkHealth(ctx, m)
		if ctx.Err() != nil || !m.b.Healthy() {
			return
		}
		f.scrape(ctx, m) // first, so that discovery sees the KV cache shape
		f.discover(ctx, m)
	})
}

// Run keeps the fleet current until ctx ends: a health round (with model
// discovery when due) every HealthInterval and a scrape of the healthy
// backends every ScrapeInterval, the first of each at once. It returns nil
// when ctx ends, or ErrRunning if the fleet is already running.
func (f *Fleet) Run(ctx context.Context) error {
	if !f.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer f.running.Store(false)
	var wg sync.WaitGroup
	wg.Go(func() { tick(ctx, f.healthEvery, f.healthRound) })
	wg.Go(func() { tick(ctx, f.scrapeEvery, f.scrapeRound) })
	wg.Wait()
	return nil
}

// tick runs round now and then every interval until ctx ends. A round that
// overruns the interval delays the next one rather than overlapping it.
func tick(ctx context.Context, every time.Duration, round func(context.Context)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// healthRound checks every backend and discovers those that are due.
func (f *Fleet) healthRound(ctx context.Context) {
	f.each(f.members(), func(m *member) {
		if f.checkHealth(ctx, m) {
			f.discover(ctx, m)
		}
	})
}

// scrapeRound scrapes every healthy backend; an unhealthy one's metrics are
// left to go stale.
func (f *Fleet) scrapeRound(ctx context.Context) {
	f.each(f.members(), func(m *member) {
		if m.b.Healthy() {
			f.scrape(ctx, m)
		}
	})
}

// each runs fn for every member in parallel and waits for all.
func (f *Fleet) each(ms []*member, fn func(*member)) {
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Go(func() { fn(m) })
	}
	wg.Wait()
}

// fetch GETs url of backend b within the probe timeout. A 2xx response's
// body, limited to limit bytes, goes to read (if not nil); other statuses
// are a *StatusError.
func (f *Fleet) fetch(ctx context.Context, b *Backend, url, accept string, limit int64, read func(io.Reader) error) error {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	b.Authorize(req.Header)
	resp, err := f.client.Do(req)
	if err != nil {
		return err
	}
	defer func() {
		// Drain a little so the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return &StatusError{URL: url, StatusCode: resp.StatusCode}
	}
	if read == nil {
		return nil
	}
	if err := read(&limitReader{r: resp.Body, n: limit}); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

// limitReader is io.LimitReader that fails, rather than ends early, past its
// limit: a truncated body must not parse as a valid one.
type limitReader struct {
	r io.Reader
	n int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		// Tell a body that ends exactly at the limit from one that goes on.
		var one [1]byte
		if n, _ := l.r.Read(one[:]); n > 0 {
			return 0, ErrBodyTooLarge
		}
		return 0, io.EOF
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}
