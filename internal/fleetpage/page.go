// Package fleetpage is the live view of the fleet an operator opens in a
// browser: one self-contained HTML page (/fleet) that polls a JSON view
// (/fleet.json) of every backend's health, rotation, load, cache and
// predictions, the admission queue, retries, migrations and the last
// routing decisions with their cost terms. It is served on the admin
// listener beside /metrics. Its cost when no one looks is one ring write per routed attempt
// (Decisions); everything else is read when the page asks.
package fleetpage

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// Paths the page is served at, on the admin listener.
const (
	PagePath = "/fleet"
	JSONPath = "/fleet.json"
)

//go:embed page.html
var pageHTML []byte

// Config describes the page's sources. Fleet and Router are required.
type Config struct {
	Fleet  *fleet.Fleet
	Router *router.Router
	// Gatherer reads the router's metrics (the proxy's registry), for the
	// counts the page shows per minute: served by reason, TTFT, cached
	// tokens, retries, migrations, the admission queue. Nil: those are
	// left empty.
	Gatherer prometheus.Gatherer
	// Decisions is how many recent decisions to keep (0: DefaultDecisions).
	Decisions int
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Page serves the fleet page and its JSON. Safe for concurrent use.
type Page struct {
	fleet     *fleet.Fleet
	router    *router.Router
	gatherer  prometheus.Gatherer
	decisions *Decisions
	now       func() time.Time

	mu     sync.Mutex // one view at a time: it guards window
	window window
}

// New returns the page for cfg, and makes its ring of decisions the
// router's observer: call it before the router routes.
func New(cfg Config) *Page {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Page{fleet: cfg.Fleet, router: cfg.Router, gatherer: cfg.Gatherer, now: cfg.Now,
		decisions: NewDecisions(cfg.Decisions, cfg.Now),
		window:    window{span: DefaultWindow, every: sampleEvery}}
	cfg.Router.SetObserver(p.decisions)
	return p
}

// Decisions returns the page's ring of recent decisions.
func (p *Page) Decisions() *Decisions { return p.decisions }

// ServeHTTP serves the page at PagePath and its JSON at JSONPath, GET and
// HEAD only; other paths get 404.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != PagePath && r.URL.Path != JSONPath {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if r.URL.Path == PagePath {
		// The page loads nothing from elsewhere, and this makes sure: its
		// own inline style and script, and fetches of its JSON only.
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		h.Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(pageHTML)
		return
	}
	b, err := json.Marshal(p.View())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	h.Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// View returns the fleet as the page shows it now.
func (p *Page) View() View {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	bs := p.fleet.Backends()
	cur, gauges := p.read(bs)
	base := p.window.add(now, cur)
	v := View{Time: now, Policy: p.router.Name(), WindowSeconds: now.Sub(base.at).Seconds(),
		Decisions: p.decisions.Views(), DecisionsSkipped: p.decisions.Skipped()}
	predicted := latestTTFT(v.Decisions)
	acc := p.router.Accuracy()
	v.Backends = make([]BackendView, len(bs))
	for i, b := range bs {
		bv := p.backend(b, now)
		bv.PredictedTTFTMs = unknown
		if t, ok := predicted[b.Name]; ok {
			bv.PredictedTTFTMs = t
		}
		bv.Accuracy = AccuracyView{MedianError: unknown, Coverage: unknown}
		if b.Index < len(acc.Backends) { // indexes are never reused: the index is the backend
			s := acc.Backends[b.Index]
			bv.Accuracy = AccuracyView{Count: s.Count, Scored: s.Scored, MedianError: Num(s.MedianAPE), Coverage: Num(s.Coverage)}
		}
		bv.windowed(cur, base.c)
		v.Backends[i] = bv
	}
	v.Admission = AdmissionView{Queued: int64(gauges.queued), InFlight: int64(gauges.inFlight),
		Rejected: byLabel(kindRejected, cur, base.c, true), RejectedTotal: byLabel(kindRejected, cur, base.c, false)}
	v.Retries, v.RetriesTotal = byLabel(kindRetries, cur, base.c, true), byLabel(kindRetries, cur, base.c, false)
	v.Migrations, v.MigrationsTotal = byLabel(kindMigrations, cur, base.c, true), byLabel(kindMigrations, cur, base.c, false)
	return v
}

// backend is b's state, load and scrape now.
func (p *Page) backend(b *fleet.Backend, now time.Time) BackendView {
	rot := p.fleet.Rotation(b)
	load := b.Load()
	bv := BackendView{Name: b.Name, URL: b.URL.String(), Index: b.Index, Healthy: rot.Healthy, Ejected: rot.Ejected,
		Ejections: rot.Ejections, Models: []string{},
		InFlight: load.Requests, PrefillTokens: load.PrefillTokens, Decoding: load.Decoding, DecodeTokens: load.DecodeTokens}
	switch {
	case !rot.Healthy:
		bv.State = "down"
	case rot.Ejected:
		bv.State = "ejected"
	case !rot.BackoffUntil.IsZero():
		bv.State = "backoff"
	default:
		bv.State = "up"
	}
	if rot.Ejected {
		bv.EjectedUntil = &rot.EjectedUntil
	}
	if !rot.BackoffUntil.IsZero() {
		bv.BackoffUntil = &rot.BackoffUntil
	}
	if info := b.Info(); info != nil {
		bv.Models = info.Models
	}
	if m := p.fleet.Metrics(b); m != nil {
		e := &EngineView{Running: m.Running, Waiting: m.Waiting, KVUsage: unknown, HitRate: unknown,
			AgeSeconds: max(now.Sub(m.At).Seconds(), 0)}
		if m.KVUsage >= 0 {
			e.KVUsage = Num(m.KVUsage)
		}
		bv.Engine = e
	}
	return bv
}

// windowed fills bv's counts over the window, from the counters now and at
// its start.
func (bv *BackendView) windowed(cur, base counters) {
	bv.Served = map[string]int64{}
	for k := range cur {
		if k.kind == kindServed && k.a == bv.Name {
			if n := int64(delta(cur, base, k)); n > 0 {
				bv.Served[k.b] += n
				bv.ServedTotal += n
			}
		}
	}
	d := func(kind string) float64 { return delta(cur, base, key{kind: kind, a: bv.Name}) }
	bv.HitRate = ratio(d(kindCached), d(kindPrompt))
	bv.ObservedTTFTMs = unknown
	if n := d(kindTTFTCount); n > 0 {
		bv.ObservedTTFTMs = Num(d(kindTTFTSum) / n * 1000)
	}
	if bv.Engine != nil {
		bv.Engine.HitRate = ratio(d(kindEngineHits), d(kindEngineQuery))
	}
}

// byLabel sums the counts of kind by their first label: in the window when
// windowed, else since the start.
func byLabel(kind string, cur, base counters, windowed bool) map[string]int64 {
	out := map[string]int64{}
	for k, v := range cur {
		if k.kind != kind {
			continue
		}
		if windowed {
			v = delta(cur, base, k)
		}
		out[k.a] += int64(v)
	}
	return out
}
