package fleetpage

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// scoring picks the first candidate and scores every one with two terms,
// the cheapest last, as a cost-summing policy explains itself.
type scoring struct{ names []string }

func (scoring) Name() string { return "scoring" }

func (p scoring) Pick(req *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	d := router.Decision{Backend: cands[0], Reason: "least-cost", Cached: 7, PredictedTTFT: 250 * time.Millisecond}
	for i, b := range cands {
		s := router.Score{Backend: b.Name, Cost: float64(len(cands) - i), TTFT: time.Duration(100*(i+1)) * time.Millisecond}
		s.Terms.Names = p.names
		s.Terms.Seconds[0], s.Terms.Seconds[1] = s.Cost/2, s.Cost/2
		d.Scores = append(d.Scores, s)
	}
	return d, nil
}

// clock is a settable clock.
type clock struct{ t time.Time }

func (c *clock) Now() time.Time { return c.t }

func newBackends(n int) []*fleet.Backend {
	bs := make([]*fleet.Backend, n)
	for i := range bs {
		bs[i] = fleet.NewBackend(i, fmt.Sprintf("gpu%d", i), &url.URL{Scheme: "http", Host: fmt.Sprintf("10.0.0.%d:8000", i)})
		bs[i].SetInfo(&fleet.Info{Models: []string{"m"}})
	}
	return bs
}

func route(t testing.TB, rt *router.Router, cands []*fleet.Backend) {
	t.Helper()
	tk, err := rt.Route(&router.Request{Model: "m", Prompt: "hello there", MaxTokens: 9}, cands)
	if err != nil {
		t.Fatal(err)
	}
	tk.Finish(router.Failed(0))
}

func TestDecisionsKeepTheLastN(t *testing.T) {
	bs := newBackends(3)
	rt := router.NewRouter(scoring{[]string{"queued", "compute"}}, nil)
	d := NewDecisions(4, nil)
	rt.SetObserver(d)
	if got := d.Views(); len(got) != 0 {
		t.Fatalf("an empty ring shows %d decisions", len(got))
	}
	for i := range 6 {
		route(t, rt, bs[i%3:])
	}
	got := d.Views()
	if len(got) != 4 {
		t.Fatalf("%d decisions, want 4", len(got))
	}
	// Newest first: the 6th pick had bs[2:], the 5th bs[1:], the 4th bs.
	for i, want := range []string{"gpu2", "gpu1", "gpu0", "gpu2"} {
		if got[i].Backend != want {
			t.Errorf("decision %d chose %s, want %s", i, got[i].Backend, want)
		}
	}
	c := got[2].Candidates
	if got[2].Scored != 3 || len(c) != 3 || c[0].Backend != "gpu2" || c[0].Cost != 1 || c[2].Cost != 3 {
		t.Fatalf("candidates not cheapest first: %+v", c)
	}
	b, err := json.Marshal(got[2])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"reason":"least-cost"`, `"terms":{"queued":0.5,"compute":0.5}`, `"predicted_ttft_ms":250`, `"cached":7`, `"predicted_low_ms":null`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("decision JSON lacks %s: %s", want, b)
		}
	}
}

// TestRoutedAllocatesNothing holds the page's promise to the request path.
func TestRoutedAllocatesNothing(t *testing.T) {
	bs := newBackends(16)
	rt := router.NewRouter(scoring{[]string{"queued", "compute"}}, nil)
	tk, err := rt.Route(&router.Request{Model: "m", Prompt: "hi"}, bs)
	if err != nil {
		t.Fatal(err)
	}
	d := NewDecisions(0, nil)
	if n := testing.AllocsPerRun(1000, func() { d.Routed(tk) }); n != 0 {
		t.Errorf("Routed allocates %v times a call, want 0", n)
	}
}

func TestWindow(t *testing.T) {
	w := window{span: time.Minute, every: 5 * time.Second}
	t0 := time.Unix(1000, 0)
	k := key{kind: kindServed, a: "gpu0", b: "prefix"}
	at := func(s int, v float64) (time.Duration, float64) {
		base := w.add(t0.Add(time.Duration(s)*time.Second), counters{k: v})
		return t0.Add(time.Duration(s) * time.Second).Sub(base.at), base.c[k]
	}
	tests := []struct {
		sec       int
		v         float64
		wantSpan  time.Duration
		wantStart float64
	}{
		{0, 1, 0, 1},
		{1, 2, time.Second, 1}, // too soon for a sample of its own
		{10, 5, 10 * time.Second, 1},
		{70, 9, 60 * time.Second, 5}, // the sample at 10 s is a minute old
		{200, 9, 130 * time.Second, 9},
	}
	for _, tt := range tests {
		span, start := at(tt.sec, tt.v)
		if span != tt.wantSpan || start != tt.wantStart {
			t.Errorf("at %d s: window %v from %v, want %v from %v", tt.sec, span, start, tt.wantSpan, tt.wantStart)
		}
	}
	if len(w.samples) > int(w.span/w.every)+2 {
		t.Errorf("%d samples held", len(w.samples))
	}
}

// TestView checks /fleet.json against a registry holding the proxy's and
// the admission queue's metric names, and the page's own headers.
func TestView(t *testing.T) {
	bs := newBackends(2)
	clk := &clock{time.Unix(5000, 0)}
	f := fleet.New(bs, fleet.Options{Now: clk.Now})
	bs[1].SetHealthy(false)
	rt := router.NewRouter(scoring{[]string{"queued", "compute"}}, nil)
	reg := prometheus.NewRegistry()
	served := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_requests_total"}, []string{"backend", "status", "reason", "model"})
	retries := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_retries_total"}, []string{"backend", "reason"})
	queue := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvroute_admission_queue_length"}, []string{"class"})
	migrations := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_migrations_total"}, []string{"cause", "outcome"})
	reg.MustRegister(served, retries, queue, migrations)
	p := New(Config{Fleet: f, Router: rt, Gatherer: reg, Now: clk.Now})
	h := httptest.NewServer(p)
	defer h.Close()

	served.WithLabelValues("gpu0", "200", "prefix", "m").Add(3)
	p.View() // the window starts here
	clk.t = clk.t.Add(30 * time.Second)
	served.WithLabelValues("gpu0", "200", "prefix", "m").Add(2)
	served.WithLabelValues("gpu0", "502", "least-cost", "m").Inc()
	served.WithLabelValues("none", "429", "none", "none").Inc()
	retries.WithLabelValues("gpu1", "dial").Inc()
	migrations.WithLabelValues("reset", "continued").Add(2)
	migrations.WithLabelValues("idle", "continued").Inc()
	migrations.WithLabelValues("reset", "unsafe").Inc()
	queue.WithLabelValues("default").Set(4)
	route(t, rt, bs[:1])

	res, err := http.Get(h.URL + JSONPath)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var v View
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	if v.WindowSeconds != 30 || v.Policy != "scoring" || len(v.Backends) != 2 || len(v.Decisions) != 1 {
		t.Fatalf("view: window %v, policy %q, %d backends, %d decisions", v.WindowSeconds, v.Policy, len(v.Backends), len(v.Decisions))
	}
	b0, b1 := v.Backends[0], v.Backends[1]
	if b0.State != "up" || b1.State != "down" || b1.Healthy {
		t.Errorf("states %s, %s; want up, down", b0.State, b1.State)
	}
	if b0.ServedTotal != 3 || b0.Served["prefix"] != 2 || b0.Served["least-cost"] != 1 || b1.ServedTotal != 0 {
		t.Errorf("served in the window: %v (%d), %v", b0.Served, b0.ServedTotal, b1.Served)
	}
	if b0.PredictedTTFTMs != 100 || b1.PredictedTTFTMs != 0 { // null decodes as 0
		t.Errorf("predicted TTFT %v, %v; want 100 and null", b0.PredictedTTFTMs, b1.PredictedTTFTMs)
	}
	if v.Retries["dial"] != 1 || v.RetriesTotal["dial"] != 1 || v.Admission.Queued != 4 {
		t.Errorf("retries %v, queued %d", v.Retries, v.Admission.Queued)
	}
	if v.Migrations["continued"] != 3 || v.Migrations["unsafe"] != 1 || v.MigrationsTotal["continued"] != 3 {
		t.Errorf("migrations %v, since the start %v; want 3 continued and 1 unsafe", v.Migrations, v.MigrationsTotal)
	}

	page, err := http.Get(h.URL + PagePath)
	if err != nil {
		t.Fatal(err)
	}
	page.Body.Close()
	if csp := page.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.HasPrefix(page.Header.Get("Content-Type"), "text/html") {
		t.Errorf("page headers: %v", page.Header)
	}
	post, err := http.Post(h.URL+JSONPath, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	post.Body.Close()
	if post.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", post.StatusCode)
	}
}

// TestPageIsSelfContained guards the promise of no external assets.
func TestPageIsSelfContained(t *testing.T) {
	for _, bad := range []string{"http://", "https://", "src=", "<link", "@import"} {
		if strings.Contains(string(pageHTML), bad) {
			t.Errorf("the page refers to something outside itself: %q", bad)
		}
	}
}

var sinkViews []DecisionView

// BenchmarkRouted is the page's cost on the request path: one decision of
// n candidates copied into the ring.
func BenchmarkRouted(b *testing.B) {
	for _, n := range []int{4, 16, 64} {
		b.Run(fmt.Sprintf("candidates=%d", n), func(b *testing.B) {
			rt := router.NewRouter(scoring{[]string{"queued", "compute"}}, nil)
			tk, err := rt.Route(&router.Request{Model: "m", Prompt: "hi"}, newBackends(n))
			if err != nil {
				b.Fatal(err)
			}
			d := NewDecisions(0, nil)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					d.Routed(tk)
				}
			})
			b.ReportMetric(float64(d.Skipped())/float64(b.N), "skipped/op")
			sinkViews = d.Views()
		})
	}
}
