package proxy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// fakeFleet is a Fleet over fixed backends. MarkFailed takes a backend out
// of rotation and records why.
type fakeFleet struct {
	backends []*fleet.Backend
	notReady atomic.Bool

	mu      sync.Mutex
	failed  map[string]error
	reports map[string][]fleet.ResultKind
	backoff map[string]time.Time
}

// Both the real fleet and the fake are Fleets.
var (
	_ Fleet = (*fleet.Fleet)(nil)
	_ Fleet = (*fakeFleet)(nil)
)

func newFakeFleet(bs ...*fleet.Backend) *fakeFleet {
	return &fakeFleet{backends: bs, failed: make(map[string]error),
		reports: make(map[string][]fleet.ResultKind), backoff: make(map[string]time.Time)}
}

func (f *fakeFleet) Candidates(dst []*fleet.Backend, model string) []*fleet.Backend {
	for _, b := range f.backends {
		if b.Healthy() && b.Info().Serves(model) {
			dst = append(dst, b)
		}
	}
	return dst
}

func (f *fakeFleet) Healthy(dst []*fleet.Backend) []*fleet.Backend {
	for _, b := range f.backends {
		if b.Healthy() {
			dst = append(dst, b)
		}
	}
	return dst
}

func (f *fakeFleet) Models() []string {
	var ms []string
	for _, b := range f.backends {
		if i := b.Info(); i != nil {
			ms = append(ms, i.Models...)
		}
	}
	return ms
}

func (f *fakeFleet) Ready() bool {
	if f.notReady.Load() {
		return false
	}
	for _, b := range f.backends {
		if b.Healthy() {
			return true
		}
	}
	return false
}

func (f *fakeFleet) MarkFailed(b *fleet.Backend, err error) {
	b.SetHealthy(false)
	f.mu.Lock()
	f.failed[b.Name] = err
	f.mu.Unlock()
}

func (f *fakeFleet) Backends() []*fleet.Backend { return f.backends }

// Report records the result; the fake ejects nothing.
func (f *fakeFleet) Report(b *fleet.Backend, r fleet.Result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reports[b.Name] = append(f.reports[b.Name], r.Kind)
}

// Backoff records until when b is to be avoided; the fake avoids nothing.
func (f *fakeFleet) Backoff(b *fleet.Backend, until time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.backoff[b.Name] = until
}

// backedOff returns until when backend name is to be avoided.
func (f *fakeFleet) backedOff(name string) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.backoff[name]
}

// reported returns the results reported of backend name.
func (f *fakeFleet) reported(name string) []fleet.ResultKind {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fleet.ResultKind(nil), f.reports[name]...)
}

func (f *fakeFleet) failure(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed[name]
}

// testBackend returns a healthy backend at rawURL that serves models.
func testBackend(t testing.TB, index int, name, rawURL string, models ...string) *fleet.Backend {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	b := fleet.NewBackend(index, name, u)
	b.SetInfo(&fleet.Info{Models: models})
	return b
}

// firstPolicy picks the first candidate, claims a fixed cached prefix, and
// records every request and outcome.
type firstPolicy struct {
	// prefix is the cached tokens it claims for every request.
	prefix int
	// err, if set, is returned by Pick.
	err error
	// predict is the TTFT it predicts for every request.
	predict time.Duration

	mu       sync.Mutex
	requests []router.Request
	outcomes chan observed
}

// observed is an outcome with the request and decision it ended.
type observed struct {
	router.Outcome
	Request  *router.Request
	Decision router.Decision
}

var _ router.Policy = (*firstPolicy)(nil)

func newFirstPolicy() *firstPolicy { return &firstPolicy{outcomes: make(chan observed, 100)} }

// routerOf returns a Router driving pol.
func routerOf(pol router.Policy) *router.Router { return router.NewRouter(pol, nil) }

func (*firstPolicy) Name() string { return "first" }

func (p *firstPolicy) Pick(req *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	p.mu.Lock()
	p.requests = append(p.requests, *req)
	p.mu.Unlock()
	if p.err != nil {
		return router.Decision{}, p.err
	}
	d := router.Decision{
		Backend:       cands[0],
		Reason:        "first",
		Cached:        min(p.prefix, req.PromptTokens),
		PredictedTTFT: p.predict,
		PredictedITL:  p.predict / 20,
		Scores: []router.Score{{Backend: cands[0].Name, Cost: 1, Cached: p.prefix,
			Terms: router.Terms{Names: firstTerms, Seconds: [router.MaxTerms]float64{0.25, 0.75}}}},
	}
	seen := d
	d.Done = func(o router.Outcome) {
		select {
		case p.outcomes <- observed{Outcome: o, Request: req, Decision: seen}:
		default: // never block the proxy; tests read what they need
		}
	}
	return d, nil
}

// outcome waits for the next outcome the proxy reports.
func (p *firstPolicy) outcome(t testing.TB) observed {
	t.Helper()
	select {
	case o := <-p.outcomes:
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("no outcome reported")
		return observed{}
	}
}

func (p *firstPolicy) lastRequest(t testing.TB) router.Request {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.requests) == 0 {
		t.Fatal("the policy was not asked")
	}
	return p.requests[len(p.requests)-1]
}

func (p *firstPolicy) asked() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.requests)
}

// discard is a logger that drops everything.
var discard = slog.New(slog.DiscardHandler)

// firstTerms names the two terms of firstPolicy's cost of 1.
var firstTerms = []string{"queued", "miss"}

// server is an httptest server around h whose handler calls can be awaited:
// done receives once each call has returned (panics included).
type server struct {
	*httptest.Server
	done chan struct{}
}

func newServer(t testing.TB, h http.Handler) *server {
	t.Helper()
	s := &server{done: make(chan struct{}, 100)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { s.done <- struct{}{} }()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// await waits for a handler call to return.
func (s *server) await(t testing.TB) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatal("handler did not return")
	}
}

// newTestProxy serves a proxy over f with policy pol, after mod edits its
// config.
func newTestProxy(t testing.TB, f Fleet, pol router.Policy, mod func(*Config)) (*Proxy, *server) {
	t.Helper()
	cfg := Config{Fleet: f, Router: routerOf(pol), Logger: discard}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, newServer(t, p)
}

// startEmulator runs an emulated vLLM server for model at the time scale.
func startEmulator(t testing.TB, model string, scale float64) *server {
	t.Helper()
	em, err := emulator.New(emulator.Config{Model: model, TimeScale: scale, Seed: 1, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = em.Run(ctx)
	}()
	// Cleanups run last-in first-out: the server closes (waiting for its
	// handlers, which need the driver) before the driver stops.
	t.Cleanup(func() {
		cancel()
		<-stopped
	})
	return newServer(t, em)
}

// assertIdle fails if any backend still counts load.
func assertIdle(t testing.TB, bs ...*fleet.Backend) {
	t.Helper()
	for _, b := range bs {
		if l := b.Load(); l != (fleet.Load{}) {
			t.Errorf("backend %s still has load %+v", b.Name, l)
		}
	}
}

// post sends body to the proxy's path and returns the response with its
// body read.
func post(t testing.TB, url, path, body string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(data)
}
