package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// newTestFleet returns a fleet of the fakes, named b0, b1, ..., logging to
// the returned buffer.
func newTestFleet(t *testing.T, opts Options, fakes ...*fakeBackend) (*Fleet, []*Backend, *logBuffer) {
	t.Helper()
	log, buf := newTestLogger()
	opts.Logger = log
	bs := make([]*Backend, len(fakes))
	for i, fb := range fakes {
		bs[i] = fb.backend(t, i, fmt.Sprintf("b%d", i))
	}
	return New(bs, opts), bs, buf
}

func TestDiscovery(t *testing.T) {
	tests := []struct {
		name          string
		models        string
		metrics       string
		wantModels    []string
		wantBlockSize int
		wantKVBlocks  int
	}{
		{"vllm", vllmModels, vllmMetrics,
			[]string{"meta-llama/Llama-3.1-8B-Instruct", "sql-lora"}, 16, 27306},
		{"vllm data parallel", `{"data":[{"id":"m"}]}`, vllmDPMetrics, []string{"m"}, 16, 2000},
		{"vllm v0", `{"data":[{"id":"meta-llama/Llama-2-7b-hf"}]}`, vllmV0Metrics,
			[]string{"meta-llama/Llama-2-7b-hf"}, 16, 7412},
		{"sglang", sglangModels, sglangMetrics, []string{"Qwen/Qwen2.5-7B-Instruct"}, 0, 0},
		{"llama.cpp", llamacppModels, llamacppMetrics, []string{"qwen2.5-7b-instruct-q4_k_m.gguf"}, 0, 0},
		{"duplicate ids", `{"data":[{"id":"a"},{"id":"a"},{"id":""},{"id":"b"}]}`, llamacppNewMetrics,
			[]string{"a", "b"}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := newFakeBackend(t, tt.models, tt.metrics)
			f, bs, _ := newTestFleet(t, Options{}, fb)
			if f.Ready() {
				t.Fatal("Ready before discovery")
			}
			f.Refresh(t.Context())
			info := bs[0].Info()
			if info == nil {
				t.Fatal("no Info after Refresh")
			}
			if !slices.Equal(info.Models, tt.wantModels) {
				t.Errorf("Models = %q, want %q", info.Models, tt.wantModels)
			}
			if info.BlockSize != tt.wantBlockSize || info.KVBlocks != tt.wantKVBlocks {
				t.Errorf("BlockSize, KVBlocks = %d, %d; want %d, %d",
					info.BlockSize, info.KVBlocks, tt.wantBlockSize, tt.wantKVBlocks)
			}
			if !f.Ready() {
				t.Error("not Ready after discovery")
			}
		})
	}
}

func TestDiscoveryFailures(t *testing.T) {
	tests := []struct {
		name   string
		models string
		status int
	}{
		{"no models", `{"object":"list","data":[]}`, 0},
		{"not json", `<html>oops</html>`, 0},
		{"server error", `{}`, http.StatusInternalServerError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := newFakeBackend(t, tt.models, vllmMetrics)
			fb.set(func(fb *fakeBackend) { fb.modelsStatus = tt.status })
			f, bs, logs := newTestFleet(t, Options{}, fb)
			f.Refresh(t.Context())
			f.Refresh(t.Context())
			if bs[0].Info() != nil {
				t.Errorf("Info = %+v, want none", bs[0].Info())
			}
			if !bs[0].Healthy() {
				t.Error("a discovery failure took the backend down; only health checks do")
			}
			if f.Ready() {
				t.Error("Ready without a discovered backend")
			}
			if n := logs.count("backend discovery failed"); n != 1 {
				t.Errorf("logged discovery failure %d times, want once:\n%s", n, logs)
			}
		})
	}
}

func TestScrape(t *testing.T) {
	tests := []struct {
		name    string
		metrics string
		want    Metrics
	}{
		{"vllm", vllmMetrics, Metrics{Running: 12, Waiting: 3, KVUsage: 0.4375,
			PrefixHits: 393216, PrefixQueries: 1048576}},
		// Counts and counters add up over the engines; usage averages.
		{"vllm data parallel", vllmDPMetrics, Metrics{Running: 12, Waiting: 1, KVUsage: 0.6,
			PrefixHits: 400, PrefixQueries: 4000}},
		{"vllm v0", vllmV0Metrics, Metrics{Running: 4, Waiting: 9, KVUsage: 0.9921875}},
		{"sglang", sglangMetrics, Metrics{Running: 7, Waiting: 4, KVUsage: 0.55,
			PrefixHits: 60000, PrefixQueries: 200000}},
		{"llama.cpp", llamacppMetrics, Metrics{Running: 2, Waiting: 5, KVUsage: 0.125}},
		{"llama.cpp without KV gauge", llamacppNewMetrics, Metrics{Running: 1, Waiting: 0, KVUsage: -1}},
		{"several models", `vllm:num_requests_running{model_name="a"} 1
vllm:num_requests_running{model_name="b"} 2
vllm:num_requests_waiting{model_name="a"} 3
vllm:num_requests_waiting{model_name="b"} 4
`, Metrics{Running: 3, Waiting: 7, KVUsage: -1}},
		{"no trailing newline, NaN and odd spacing", "  vllm:num_requests_running{model_name=\"a\"}\t2\n" +
			"vllm:num_requests_waiting{model_name=\"a\"} 1\nvllm:kv_cache_usage_perc{model_name=\"a\"} NaN\n" +
			"vllm:num_requests_waiting{model_name=\"b\"} 1", Metrics{Running: 2, Waiting: 2, KVUsage: -1}},
		{"usage clamped", "sglang:num_running_reqs 1\nsglang:token_usage 1.5\n",
			Metrics{Running: 1, KVUsage: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := newFakeBackend(t, `{"data":[{"id":"m"}]}`, tt.metrics)
			clock := newFakeClock()
			f, bs, _ := newTestFleet(t, Options{Now: clock.Now}, fb)
			f.Refresh(t.Context())
			got := f.Metrics(bs[0])
			if got == nil {
				t.Fatal("no metrics")
			}
			want := tt.want
			want.At = clock.Now()
			if !closeMetrics(*got, want) {
				t.Errorf("Metrics = %+v\nwant      %+v", *got, want)
			}
		})
	}
}

func closeMetrics(a, b Metrics) bool {
	near := func(x, y float64) bool { return x-y < 1e-9 && y-x < 1e-9 }
	return near(a.Running, b.Running) && near(a.Waiting, b.Waiting) && near(a.KVUsage, b.KVUsage) &&
		near(a.PrefixHits, b.PrefixHits) && near(a.PrefixQueries, b.PrefixQueries) && a.At.Equal(b.At)
}

func TestScrapeFailures(t *testing.T) {
	tests := []struct {
		name    string
		metrics string
		status  int
	}{
		{"no known metrics", "# HELP up\nprocess_cpu_seconds_total 1\n", 0},
		{"empty", "", 0},
		// llama-server without --metrics answers 501.
		{"not enabled", "", http.StatusNotImplemented},
		{"not found", "", http.StatusNotFound},
		{"malformed value", "vllm:num_requests_running{model_name=\"a\"} twelve\n", 0},
		{"malformed labels", "vllm:num_requests_running{model_name=a} 1\n", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := newFakeBackend(t, vllmModels, tt.metrics)
			fb.set(func(fb *fakeBackend) { fb.metricsStatus = tt.status })
			f, bs, logs := newTestFleet(t, Options{}, fb)
			f.Refresh(t.Context())
			f.Refresh(t.Context())
			if m := f.Metrics(bs[0]); m != nil {
				t.Errorf("Metrics = %+v, want none", m)
			}
			if !bs[0].Healthy() {
				t.Error("a scrape failure took the backend down; only health checks do")
			}
			if n := logs.count("backend scrape failed"); n != 1 {
				t.Errorf("logged scrape failure %d times, want once:\n%s", n, logs)
			}
		})
	}
}

func TestStaleMetrics(t *testing.T) {
	fb := newFakeBackend(t, vllmModels, vllmMetrics)
	clock := newFakeClock()
	f, bs, logs := newTestFleet(t, Options{ScrapeInterval: time.Second, Now: clock.Now}, fb)
	b := bs[0]

	f.Refresh(t.Context())
	scraped := clock.Now()
	if m := f.Metrics(b); m == nil || !m.At.Equal(scraped) {
		t.Fatalf("Metrics = %+v, want a scrape at %v", m, scraped)
	}
	clock.Advance(3 * time.Second) // 3 intervals: still fresh
	if f.Metrics(b) == nil {
		t.Fatal("metrics stale after exactly 3 scrape intervals")
	}
	clock.Advance(time.Nanosecond)
	if m := f.Metrics(b); m != nil {
		t.Fatalf("stale metrics returned: %+v", m)
	}

	// A failing scrape keeps the old metrics, which go stale, and leaves the
	// backend in rotation.
	f.Refresh(t.Context())
	scraped = clock.Now()
	fb.set(func(fb *fakeBackend) { fb.metricsStatus = http.StatusInternalServerError })
	clock.Advance(time.Second)
	f.Refresh(t.Context())
	if m := f.Metrics(b); m == nil || !m.At.Equal(scraped) {
		t.Fatalf("after a failed scrape Metrics = %+v, want the scrape of %v", m, scraped)
	}
	clock.Advance(2*time.Second + time.Nanosecond)
	if m := f.Metrics(b); m != nil {
		t.Fatalf("stale metrics returned: %+v", m)
	}
	if !b.Healthy() {
		t.Error("scrape failures took the backend down")
	}

	// Recovery is logged once too.
	fb.set(func(fb *fakeBackend) { fb.metricsStatus = 0 })
	f.Refresh(t.Context())
	f.Refresh(t.Context())
	if f.Metrics(b) == nil {
		t.Error("no metrics after the scrape recovered")
	}
	if n := logs.count("backend scrape recovered"); n != 1 {
		t.Errorf("logged recovery %d times, want once:\n%s", n, logs)
	}
}

func TestHealthTransitions(t *testing.T) {
	tests := []struct {
		name       string
		fail, pass int
	}{
		{"defaults", 0, 0},
		{"fail 3 pass 2", 3, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := newFakeBackend(t, vllmModels, vllmMetrics)
			f, bs, logs := newTestFleet(t, Options{FailThreshold: tt.fail, PassThreshold: tt.pass}, fb)
			b := bs[0]
			fail, pass := max(tt.fail, 1), max(tt.pass, 1)
			ctx := t.Context()
			f.Refresh(ctx)
			if !b.Healthy() {
				t.Fatal("healthy server is down")
			}
			setHealth := func(status int) { fb.set(func(fb *fakeBackend) { fb.healthStatus = status }) }

			// Fewer failures than the threshold, then a pass: still up, and
			// the count starts over.
			setHealth(http.StatusServiceUnavailable)
			for range fail - 1 {
				f.healthRound(ctx)
			}
			setHealth(0)
			f.healthRound(ctx)
			setHealth(http.StatusInternalServerError)
			for i := range fail - 1 {
				f.healthRound(ctx)
				if !b.Healthy() {
					t.Fatalf("down after %d failures, threshold %d", i+1, fail)
				}
			}
			f.healthRound(ctx)
			if b.Healthy() {
				t.Fatalf("up after %d failures, threshold %d", fail, fail)
			}
			if got := f.Candidates(nil, "sql-lora"); len(got) != 0 {
				t.Errorf("Candidates = %v with the only backend down", names(got))
			}
			for range 3 {
				f.healthRound(ctx)
			}

			setHealth(0)
			for i := range pass - 1 {
				f.healthRound(ctx)
				if b.Healthy() {
					t.Fatalf("up after %d passes, threshold %d", i+1, pass)
				}
			}
			f.healthRound(ctx)
			if !b.Healthy() {
				t.Fatalf("down after %d passes, threshold %d", pass, pass)
			}
			for range 3 {
				f.healthRound(ctx)
			}
			if n := logs.count("backend down"); n != 1 {
				t.Errorf("logged down %d times, want once:\n%s", n, logs)
			}
			if n := logs.count("backend up"); n != 1 {
				t.Errorf("logged up %d times, want once:\n%s", n, logs)
			}
			if !strings.Contains(logs.String(), "500 Internal Server Error") {
				t.Errorf("the down log doesn't say why:\n%s", logs)
			}
		})
	}
}

// A server without /health is checked with /v1/models.
func TestHealthFallsBackToModels(t *testing.T) {
	fb := newFakeBackend(t, vllmModels, vllmMetrics)
	fb.set(func(fb *fakeBackend) { fb.healthStatus = http.StatusNotFound })
	f, bs, _ := newTestFleet(t, Options{}, fb)
	ctx := t.Context()
	f.Refresh(ctx)
	if !bs[0].Healthy() || bs[0].Info() == nil {
		t.Fatal("backend without /health is not up and discovered")
	}
	before := fb.count("/v1/models")
	f.healthRound(ctx)
	if fb.count("/v1/models") != before+1 {
		t.Errorf("/v1/models not asked in place of /health")
	}
	fb.set(func(fb *fakeBackend) { fb.modelsStatus = http.StatusBadGateway })
	f.healthRound(ctx)
	if bs[0].Healthy() {
		t.Error("up although /v1/models fails")
	}
}

func TestClosedServerIsDown(t *testing.T) {
	up := newFakeBackend(t, vllmModels, vllmMetrics)
	gone := newFakeBackend(t, vllmModels, vllmMetrics)
	f, bs, logs := newTestFleet(t, Options{}, up, gone)
	ctx := t.Context()
	f.Refresh(ctx)
	gone.srv.Close() // connections are refused from now on
	f.Refresh(ctx)
	if bs[1].Healthy() {
		t.Fatal("closed server still up")
	}
	if !bs[0].Healthy() {
		t.Fatal("live server down")
	}
	if got := names(f.Candidates(nil, "sql-lora")); !slices.Equal(got, []string{"b0"}) {
		t.Errorf("Candidates = %q, want [b0]", got)
	}
	if n := logs.count("backend down"); n != 1 {
		t.Errorf("logged down %d times, want once:\n%s", n, logs)
	}
}

func TestMarkFailed(t *testing.T) {
	tests := []struct {
		name string
		pass int
	}{
		{"pass 1", 1},
		{"pass 2", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb0 := newFakeBackend(t, vllmModels, vllmMetrics)
			fb1 := newFakeBackend(t, vllmModels, vllmMetrics)
			f, bs, logs := newTestFleet(t, Options{PassThreshold: tt.pass}, fb0, fb1)
			ctx := t.Context()
			f.Refresh(ctx)

			// Many requests see the same failure at once.
			refused := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() { f.MarkFailed(bs[0], refused) })
			}
			wg.Wait()
			if bs[0].Healthy() {
				t.Fatal("still up after MarkFailed")
			}
			if got := names(f.Candidates(nil, "sql-lora")); !slices.Equal(got, []string{"b1"}) {
				t.Errorf("Candidates = %q, want [b1]", got)
			}
			if n := logs.count("backend down"); n != 1 {
				t.Errorf("logged down %d times, want once:\n%s", n, logs)
			}
			if !strings.Contains(logs.String(), "connection refused") {
				t.Errorf("the down log doesn't carry the error:\n%s", logs)
			}

			// The health check brings it back once it passes.
			for range tt.pass - 1 {
				f.healthRound(ctx)
			}
			if bs[0].Healthy() {
				t.Fatalf("up after %d passes, threshold %d", tt.pass-1, tt.pass)
			}
			f.healthRound(ctx)
			if !bs[0].Healthy() {
				t.Fatal("health check did not bring it back")
			}
			if n := logs.count("backend up"); n != 1 {
				t.Errorf("logged up %d times, want once:\n%s", n, logs)
			}
		})
	}
}

// A health check that was already under way when a request failed must not
// put the backend straight back.
func TestMarkFailedDuringProbe(t *testing.T) {
	fb := newFakeBackend(t, vllmModels, vllmMetrics)
	f, bs, _ := newTestFleet(t, Options{}, fb)
	ctx := t.Context()
	f.Refresh(ctx)

	release := make(chan struct{})
	fb.set(func(fb *fakeBackend) { fb.block = release })
	before := fb.count("/health")
	done := make(chan struct{})
	go func() {
		f.healthRound(ctx)
		close(done)
	}()
	fb.waitHits(t, "/health", before+1) // the probe is in flight
	f.MarkFailed(bs[0], errors.New("connection reset by peer"))
	close(release)
	<-done
	if bs[0].Healthy() {
		t.Fatal("a probe that began before the failure brought the backend back")
	}
	fb.set(func(fb *fakeBackend) { fb.block = nil })
	f.healthRound(ctx)
	if !bs[0].Healthy() {
		t.Fatal("a probe after the failure did not bring it back")
	}
}

func TestMarkFailedForeignBackend(t *testing.T) {
	f, _, logs := newTestFleet(t, Options{})
	stranger := NewBackend(0, "stranger", &url.URL{Scheme: "http", Host: "127.0.0.1:1"})
	f.MarkFailed(stranger, errors.New("boom"))
	f.MarkFailed(nil, errors.New("boom"))
	if !stranger.Healthy() {
		t.Error("MarkFailed changed a backend of another fleet")
	}
	if logs.String() != "" {
		t.Errorf("logged: %s", logs)
	}
}

func TestRediscovery(t *testing.T) {
	fb := newFakeBackend(t, `{"data":[{"id":"old"}]}`, vllmMetrics)
	f, bs, _ := newTestFleet(t, Options{}, fb)
	b := bs[0]
	ctx := t.Context()
	f.Refresh(ctx)

	// Every rediscoverRounds health rounds, even if nothing failed.
	fb.set(func(fb *fakeBackend) { fb.models = `{"data":[{"id":"new"}]}` })
	before := fb.count("/v1/models")
	for range rediscoverRounds - 1 {
		f.healthRound(ctx)
	}
	if got := fb.count("/v1/models") - before; got != 0 {
		t.Fatalf("%d discoveries in %d rounds", got, rediscoverRounds-1)
	}
	f.healthRound(ctx)
	if got := fb.count("/v1/models") - before; got != 1 {
		t.Fatalf("%d discoveries in %d rounds, want 1", got, rediscoverRounds)
	}
	if got := b.Info().Models; !slices.Equal(got, []string{"new"}) {
		t.Fatalf("Models = %q, want [new]", got)
	}

	// And as soon as a backend comes back (it may have been redeployed).
	fb.set(func(fb *fakeBackend) { fb.healthStatus = http.StatusServiceUnavailable })
	f.healthRound(ctx)
	fb.set(func(fb *fakeBackend) {
		fb.healthStatus = 0
		fb.models = `{"data":[{"id":"newer"}]}`
	})
	f.healthRound(ctx)
	if got := b.Info().Models; !slices.Equal(got, []string{"newer"}) {
		t.Fatalf("after coming back Models = %q, want [newer]", got)
	}
	if got := b.Info().KVTokens(); got != 16*27306 {
		t.Errorf("KVTokens = %d after rediscovery, want %d", got, 16*27306)
	}
}

// The KV cache shape follows the scrapes, without waiting for discovery.
func TestCacheShapeFollowsScrape(t *testing.T) {
	fb := newFakeBackend(t, `{"data":[{"id":"m"}]}`, vllmDPMetrics)
	f, bs, _ := newTestFleet(t, Options{}, fb)
	ctx := t.Context()
	f.Refresh(ctx)
	if got := bs[0].Info().KVBlocks; got != 2000 {
		t.Fatalf("KVBlocks = %d, want 2000", got)
	}
	fb.set(func(fb *fakeBackend) { fb.metrics = vllmMetrics })
	f.scrapeRound(ctx)
	info := bs[0].Info()
	if info.KVBlocks != 27306 || !slices.Equal(info.Models, []string{"m"}) {
		t.Errorf("Info = %+v, want models [m] and 27306 blocks", info)
	}
}

func TestCandidates(t *testing.T) {
	type spec struct {
		models  []string // nil: not discovered
		healthy bool
	}
	specs := []spec{
		{[]string{"llama", "lora"}, true},
		{[]string{"llama"}, false},
		{nil, true},
		{[]string{"qwen"}, true},
		{[]string{"llama"}, true},
	}
	bs := make([]*Backend, len(specs))
	for i, s := range specs {
		bs[i] = NewBackend(i, fmt.Sprintf("b%d", i), &url.URL{Scheme: "http", Host: fmt.Sprintf("10.0.0.%d:8000", i)})
		if s.models != nil {
			bs[i].SetInfo(&Info{Models: s.models})
		}
		bs[i].SetHealthy(s.healthy)
	}
	f := New(bs, Options{})

	tests := []struct {
		model string
		want  []string
	}{
		{"llama", []string{"b0", "b4"}},
		{"lora", []string{"b0"}},
		{"qwen", []string{"b3"}},
		{"mistral", nil},
		{"", nil},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			if got := names(f.Candidates(nil, tt.model)); !slices.Equal(got, tt.want) {
				t.Errorf("Candidates(%q) = %q, want %q", tt.model, got, tt.want)
			}
		})
	}

	t.Run("appends to dst", func(t *testing.T) {
		dst := append(make([]*Backend, 0, 8), bs[3])
		got := f.Candidates(dst, "llama")
		if !slices.Equal(names(got), []string{"b3", "b0", "b4"}) {
			t.Errorf("Candidates = %q", names(got))
		}
	})
	t.Run("allocation-free", func(t *testing.T) {
		dst := make([]*Backend, 0, len(bs))
		if n := testing.AllocsPerRun(100, func() { dst = f.Candidates(dst[:0], "llama") }); n != 0 {
			t.Errorf("Candidates allocates %v times per call", n)
		}
	})
	t.Run("healthy", func(t *testing.T) {
		if got := names(f.Healthy(nil)); !slices.Equal(got, []string{"b0", "b2", "b3", "b4"}) {
			t.Errorf("Healthy = %q", got)
		}
	})
	t.Run("models", func(t *testing.T) {
		if got := f.Models(); !slices.Equal(got, []string{"llama", "lora", "qwen"}) {
			t.Errorf("Models = %q", got)
		}
	})
	t.Run("ready", func(t *testing.T) {
		if !f.Ready() {
			t.Error("not Ready")
		}
		for _, b := range bs {
			if b.Info() != nil {
				b.SetHealthy(false)
			}
		}
		if f.Ready() {
			t.Error("Ready with only an undiscovered backend up")
		}
	})
	if got := f.Backends(); len(got) != len(bs) || got[2] != bs[2] {
		t.Errorf("Backends = %q", names(got))
	}
}

func TestRun(t *testing.T) {
	fb := newFakeBackend(t, vllmModels, vllmMetrics)
	clock := newFakeClock() // never moves: metrics never go stale
	f, bs, logs := newTestFleet(t, Options{
		HealthInterval: time.Millisecond,
		ScrapeInterval: time.Millisecond,
		Now:            clock.Now,
	}, fb)
	b := bs[0]
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()

	// Rounds run one after another, so once round n+1 has probed, round n
	// has finished with what it learned.
	fb.waitHits(t, "/health", 2)
	fb.waitHits(t, "/metrics", 2)
	if b.Info() == nil || f.Metrics(b) == nil {
		t.Fatalf("after two rounds Info = %+v, Metrics = %+v", b.Info(), f.Metrics(b))
	}
	if err := f.Run(ctx); !errors.Is(err, ErrRunning) {
		t.Errorf("second Run = %v, want ErrRunning", err)
	}

	// probedAfter waits until a probe that saw the server's new state has
	// been acted on.
	probedAfter := func(change func(*fakeBackend)) {
		var n int
		fb.set(func(fb *fakeBackend) {
			change(fb)
			n = fb.hits["/health"]
		})
		fb.waitHits(t, "/health", n+2)
	}
	probedAfter(func(fb *fakeBackend) { fb.healthStatus = http.StatusInternalServerError })
	if b.Healthy() {
		t.Fatal("Run did not take a failing backend down")
	}
	probedAfter(func(fb *fakeBackend) { fb.healthStatus = 0 })
	if !b.Healthy() {
		t.Fatal("Run did not bring the backend back")
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if n := logs.count("backend down"); n != 1 {
		t.Errorf("logged down %d times, want once:\n%s", n, logs)
	}
	// Shutting down cut probes short; that is no failure.
	if !b.Healthy() {
		t.Error("shutdown took the backend down")
	}
}

func names(bs []*Backend) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.Name)
	}
	return out
}

// TestHealthFirstFailureBeforeAnyPass: the threshold is for a backend seen
// serving; one that has never passed a check (down when the router starts)
// goes out on its first failure, not FailThreshold rounds later.
func TestHealthFirstFailureBeforeAnyPass(t *testing.T) {
	fb := newFakeBackend(t, vllmModels, vllmMetrics)
	fb.set(func(fb *fakeBackend) { fb.healthStatus = http.StatusServiceUnavailable })
	f, bs, _ := newTestFleet(t, Options{FailThreshold: 3}, fb)
	f.Refresh(t.Context())
	if bs[0].Healthy() {
		t.Fatal("a backend that never passed is up after its first failed check")
	}
	fb.set(func(fb *fakeBackend) { fb.healthStatus = 0 })
	f.healthRound(t.Context())
	if !bs[0].Healthy() {
		t.Fatal("down after a pass")
	}
	fb.set(func(fb *fakeBackend) { fb.healthStatus = http.StatusServiceUnavailable })
	f.healthRound(t.Context())
	if !bs[0].Healthy() {
		t.Fatal("down after one failure, once it had passed, with threshold 3")
	}
}
