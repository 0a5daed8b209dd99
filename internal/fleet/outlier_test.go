package fleet

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Results for the tests.
var (
	gatewayErr = Result{Kind: ResultGatewayError}
	serverErr  = Result{Kind: ResultServerError}
	timeout    = Result{Kind: ResultTimeout}
	overloaded = Result{Kind: ResultOverloaded}
	success    = Result{Kind: ResultSuccess}
	// With the defaults, slow is TTFT > 4 × 1 s + 2 s = 6 s.
	slowFirst = Result{Kind: ResultSuccess, TTFT: 6*time.Second + time.Millisecond, Predicted: time.Second}
	fastFirst = Result{Kind: ResultSuccess, TTFT: 6 * time.Second, Predicted: time.Second}
	unknown   = Result{Kind: ResultSuccess, TTFT: time.Minute} // no prediction
)

func repeat(r Result, n int) []Result { return slices.Repeat([]Result{r}, n) }

// newOutlierFleet returns a fleet of n discovered backends serving "m", with
// no servers behind them (Report needs none), on clock.
func newOutlierFleet(t testing.TB, n int, opts Options, clock *fakeClock) (*Fleet, []*Backend, *logBuffer) {
	t.Helper()
	log, buf := newTestLogger()
	opts.Logger, opts.Now = log, clock.Now
	bs := make([]*Backend, n)
	for i := range bs {
		bs[i] = NewBackend(i, fmt.Sprintf("b%d", i), &url.URL{Scheme: "http", Host: fmt.Sprintf("10.0.0.%d:8000", i)})
		bs[i].SetInfo(&Info{Models: []string{"m"}})
	}
	return New(bs, opts), bs, buf
}

func report(f *Fleet, b *Backend, rs ...Result) {
	for _, r := range rs {
		f.Report(b, r)
	}
}

func TestEjectionStreaks(t *testing.T) {
	tests := []struct {
		name    string
		opts    OutlierOptions
		results []Result
		want    string // the ejection reason, "" for none
	}{
		{"5 server errors", OutlierOptions{}, repeat(serverErr, 5), "5xx"},
		{"4 server errors", OutlierOptions{}, repeat(serverErr, 4), ""},
		{"a success resets the 5xx streak",
			OutlierOptions{}, slices.Concat(repeat(serverErr, 4), []Result{success}, repeat(serverErr, 4)), ""},
		{"3 gateway errors", OutlierOptions{}, repeat(gatewayErr, 3), "gateway"},
		{"a success resets the gateway streak",
			OutlierOptions{}, slices.Concat(repeat(gatewayErr, 2), []Result{success}, repeat(gatewayErr, 2)), ""},
		{"gateway errors are 5xx too",
			OutlierOptions{}, []Result{serverErr, gatewayErr, serverErr, gatewayErr, serverErr}, "5xx"},
		{"a server error does not break the gateway streak",
			OutlierOptions{}, []Result{gatewayErr, gatewayErr, serverErr, gatewayErr}, "gateway"},
		{"a 429 breaks no streak",
			OutlierOptions{}, []Result{gatewayErr, gatewayErr, overloaded, gatewayErr}, "gateway"},
		{"3 timeouts", OutlierOptions{}, repeat(timeout, 3), "timeout"},
		{"a success resets the timeout streak",
			OutlierOptions{}, []Result{timeout, timeout, success, timeout, timeout}, ""},
		{"thresholds set", OutlierOptions{ConsecutiveGatewayErrors: 1}, []Result{gatewayErr}, "gateway"},
		{"5xx disabled", OutlierOptions{Consecutive5xx: -1}, repeat(serverErr, 50), ""},
		{"5 slow first tokens", OutlierOptions{}, repeat(slowFirst, 5), "slow"},
		{"fast enough", OutlierOptions{}, repeat(fastFirst, 50), ""},
		{"a fast first token resets the slow streak",
			OutlierOptions{}, slices.Concat(repeat(slowFirst, 4), []Result{fastFirst}, repeat(slowFirst, 4)), ""},
		{"successes without a prediction neither count nor reset",
			OutlierOptions{}, slices.Concat(repeat(slowFirst, 4), repeat(unknown, 10), []Result{slowFirst}), "slow"},
		{"errors do not reset the slow streak",
			OutlierOptions{}, slices.Concat(repeat(slowFirst, 4), []Result{serverErr}, []Result{slowFirst}), "slow"},
		{"latency knobs",
			OutlierOptions{LatencyFactor: 2, LatencyFloor: time.Second, ConsecutiveSlow: 2},
			repeat(Result{Kind: ResultSuccess, TTFT: 3*time.Second + 1, Predicted: time.Second}, 2), "slow"},
		{"latency knobs, fast enough",
			OutlierOptions{LatencyFactor: 2, LatencyFloor: time.Second, ConsecutiveSlow: 2},
			repeat(Result{Kind: ResultSuccess, TTFT: 3 * time.Second, Predicted: time.Second}, 20), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, bs, logs := newOutlierFleet(t, 2, Options{Outlier: tt.opts}, newFakeClock())
			b := bs[0]
			for i, r := range tt.results {
				if f.Ejected(b) {
					t.Fatalf("ejected after %d of %d results", i, len(tt.results))
				}
				f.Report(b, r)
			}
			if got := f.Ejected(b); got != (tt.want != "") {
				t.Fatalf("Ejected = %v, want %v", got, tt.want != "")
			}
			if f.Ejected(bs[1]) {
				t.Error("the other backend was ejected")
			}
			if tt.want == "" {
				if n := logs.count("backend ejected"); n != 0 {
					t.Errorf("logged %d ejections:\n%s", n, logs)
				}
				return
			}
			if got := names(f.Candidates(nil, "m")); !slices.Equal(got, []string{"b1"}) {
				t.Errorf("Candidates = %q, want the other backend only", got)
			}
			if got := names(f.Healthy(nil)); !slices.Equal(got, []string{"b1"}) {
				t.Errorf("Healthy = %q, want the other backend only", got)
			}
			if n := logs.count("backend ejected"); n != 1 {
				t.Errorf("logged %d ejections, want 1:\n%s", n, logs)
			}
			if !strings.Contains(logs.String(), "reason="+tt.want) {
				t.Errorf("the ejection log doesn't say reason=%s:\n%s", tt.want, logs)
			}
			// More results while ejected change nothing and log nothing.
			report(f, b, repeat(gatewayErr, 10)...)
			if n := logs.count("backend ejected"); n != 1 {
				t.Errorf("logged %d ejections, want 1", n)
			}
		})
	}
}

// healthyFleet returns a fleet of n fake backends, refreshed, on clock.
func healthyFleet(t *testing.T, n int, opts Options, clock *fakeClock) (*Fleet, []*Backend, []*fakeBackend, *logBuffer) {
	t.Helper()
	fakes := make([]*fakeBackend, n)
	for i := range fakes {
		fakes[i] = newFakeBackend(t, sglangModels, sglangMetrics)
	}
	opts.Now = clock.Now
	f, bs, logs := newTestFleet(t, opts, fakes...)
	f.Refresh(t.Context())
	for _, b := range bs {
		if !b.Healthy() || b.Info() == nil {
			t.Fatalf("%s: healthy %v, info %v after Refresh", b.Name, b.Healthy(), b.Info())
		}
	}
	return f, bs, fakes, logs
}

func TestRecovery(t *testing.T) {
	clock := newFakeClock()
	f, bs, fakes, logs := healthyFleet(t, 2, Options{}, clock)
	b, fb := bs[0], fakes[0]
	ctx := t.Context()
	setHealth := func(status int) { fb.set(func(fb *fakeBackend) { fb.healthStatus = status }) }

	report(f, b, repeat(gatewayErr, 3)...)
	if !f.Ejected(b) {
		t.Fatal("not ejected")
	}
	f.healthRound(ctx)
	clock.Advance(DefaultBaseEjectionTime - time.Nanosecond)
	f.healthRound(ctx)
	if !f.Ejected(b) {
		t.Fatal("returned before its ejection time, on a passed health check")
	}

	// Time is up, but the health check fails: still out.
	clock.Advance(time.Nanosecond)
	setHealth(http.StatusServiceUnavailable)
	f.healthRound(ctx)
	if !f.Ejected(b) || b.Healthy() {
		t.Fatalf("after a failed check: ejected %v, healthy %v; want ejected and down", f.Ejected(b), b.Healthy())
	}

	// A check begun after the time passes: back, and in rotation.
	setHealth(0)
	f.healthRound(ctx)
	if f.Ejected(b) || !b.Healthy() {
		t.Fatalf("after a passed check: ejected %v, healthy %v; want back", f.Ejected(b), b.Healthy())
	}
	if got := names(f.Candidates(nil, "Qwen/Qwen2.5-7B-Instruct")); !slices.Equal(got, []string{"b0", "b1"}) {
		t.Errorf("Candidates = %q after the return", got)
	}
	f.healthRound(ctx)
	if n := logs.count("backend ejected"); n != 1 {
		t.Errorf("logged %d ejections, want 1:\n%s", n, logs)
	}
	if n := logs.count("backend returned"); n != 1 {
		t.Errorf("logged %d returns, want 1:\n%s", n, logs)
	}
}

// A health check that began before the ejection time was up does not bring
// the backend back, even if it passes after.
func TestRecoveryNeedsALaterCheck(t *testing.T) {
	clock := newFakeClock()
	f, bs, fakes, _ := healthyFleet(t, 2, Options{}, clock)
	b, fb := bs[0], fakes[0]
	ctx := t.Context()

	report(f, b, repeat(timeout, 3)...)
	clock.Advance(DefaultBaseEjectionTime - time.Second)
	block := make(chan struct{})
	fb.set(func(fb *fakeBackend) { fb.block = block })
	n := fb.count("/health")
	done := make(chan struct{})
	go func() {
		f.healthRound(ctx)
		close(done)
	}()
	fb.waitHits(t, "/health", n+1)
	clock.Advance(time.Second)
	fb.set(func(fb *fakeBackend) { fb.block = nil })
	close(block)
	<-done
	if !f.Ejected(b) {
		t.Fatal("a check begun before the ejection time brought the backend back")
	}
	f.healthRound(ctx)
	if f.Ejected(b) {
		t.Fatal("a check begun after the ejection time did not bring it back")
	}
}

func TestEjectionTime(t *testing.T) {
	const (
		base    = 30 * time.Second
		maxTime = 100 * time.Second
	)
	clock := newFakeClock()
	f, bs, _, _ := healthyFleet(t, 2,
		Options{Outlier: OutlierOptions{BaseEjectionTime: base, MaxEjectionTime: maxTime}}, clock)
	b := bs[0]
	ctx := t.Context()

	// ejectFor ejects b and checks that it stays out for want exactly.
	ejectFor := func(t *testing.T, want time.Duration) {
		t.Helper()
		report(f, b, repeat(gatewayErr, 3)...)
		if !f.Ejected(b) {
			t.Fatal("not ejected")
		}
		clock.Advance(want - time.Nanosecond)
		f.healthRound(ctx)
		if !f.Ejected(b) {
			t.Fatalf("back before %v", want)
		}
		clock.Advance(time.Nanosecond)
		f.healthRound(ctx)
		if f.Ejected(b) {
			t.Fatalf("not back after %v", want)
		}
	}
	for i, want := range []time.Duration{base, 2 * base, 3 * base, maxTime, maxTime} {
		t.Run(fmt.Sprintf("ejection %d", i+1), func(t *testing.T) { ejectFor(t, want) })
	}
	// Back in rotation for less than MaxEjectionTime: not forgiven.
	clock.Advance(maxTime - time.Nanosecond)
	t.Run("not forgiven", func(t *testing.T) { ejectFor(t, maxTime) })
	// For MaxEjectionTime: forgiven, the next ejection is the first again.
	clock.Advance(maxTime)
	t.Run("forgiven", func(t *testing.T) { ejectFor(t, base) })
	t.Run("then doubles", func(t *testing.T) { ejectFor(t, 2*base) })
}

func TestEjectionLimit(t *testing.T) {
	tests := []struct {
		n, pct, want int
	}{
		{1, 0, 0}, // never eject the only backend
		{2, 0, 1}, // 50 % of 2
		{3, 0, 1}, // 50 % of 3, rounded down
		{4, 0, 2},
		{10, 0, 5},
		{3, 10, 1}, // at least one when there are two or more
		{3, 100, 3},
		{3, 250, 3},
		{3, -1, 0}, // disabled
		{0, 0, 0},
	}
	for _, tt := range tests {
		if got := ejectionLimit(tt.n, tt.pct); got != tt.want {
			t.Errorf("ejectionLimit(%d, %d) = %d, want %d", tt.n, tt.pct, got, tt.want)
		}
	}
}

func TestMaxEjectionPercent(t *testing.T) {
	tests := []struct {
		name        string
		n, pct      int
		wantEjected int
	}{
		{"one backend", 1, 0, 0},
		{"two backends", 2, 0, 1},
		{"three backends", 3, 0, 1},
		{"four backends", 4, 0, 2},
		{"all of three", 3, 100, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, bs, logs := newOutlierFleet(t, tt.n, Options{Outlier: OutlierOptions{MaxEjectionPercent: tt.pct}}, newFakeClock())
			for range 4 { // every backend fails, again and again
				for _, b := range bs {
					report(f, b, repeat(serverErr, 5)...)
				}
			}
			ejected := 0
			for _, b := range bs {
				if f.Ejected(b) {
					ejected++
				}
			}
			if ejected != tt.wantEjected {
				t.Errorf("%d of %d ejected, want %d", ejected, tt.n, tt.wantEjected)
			}
			if got := len(f.Candidates(nil, "m")); got != tt.n-tt.wantEjected {
				t.Errorf("%d candidates, want %d", got, tt.n-tt.wantEjected)
			}
			if n := logs.count("backend ejected"); n != tt.wantEjected {
				t.Errorf("logged %d ejections, want %d", n, tt.wantEjected)
			}
			if n := logs.count("backend ejection refused"); n != tt.n-tt.wantEjected {
				t.Errorf("logged %d refusals, want one per backend left in (%d):\n%s", n, tt.n-tt.wantEjected, logs)
			}
		})
	}
}

// A refused backend is ejected as soon as another returns and it fails
// again.
func TestRefusedEjectedLater(t *testing.T) {
	clock := newFakeClock()
	f, bs, _, logs := healthyFleet(t, 2, Options{}, clock)
	ctx := t.Context()
	report(f, bs[0], repeat(gatewayErr, 3)...)
	report(f, bs[1], repeat(gatewayErr, 3)...)
	if !f.Ejected(bs[0]) || f.Ejected(bs[1]) {
		t.Fatalf("ejected: b0 %v, b1 %v; want b0 only", f.Ejected(bs[0]), f.Ejected(bs[1]))
	}
	clock.Advance(DefaultBaseEjectionTime)
	f.healthRound(ctx)
	if f.Ejected(bs[0]) {
		t.Fatal("b0 did not return")
	}
	f.Report(bs[1], gatewayErr)
	if !f.Ejected(bs[1]) {
		t.Fatal("b1, still failing, not ejected once there was room")
	}
	if n := logs.count("backend ejection refused"); n != 1 {
		t.Errorf("logged %d refusals, want 1", n)
	}
}

func TestReadyAndBackoff(t *testing.T) {
	clock := newFakeClock()
	f, bs, logs := newOutlierFleet(t, 3, Options{}, clock)
	cands := func() []string { return names(f.Candidates(nil, "m")) }

	report(f, bs[0], repeat(gatewayErr, 3)...)
	f.Backoff(bs[1], clock.Now().Add(10*time.Second))
	f.Backoff(bs[1], clock.Now().Add(5*time.Second)) // earlier: changes nothing
	if got := cands(); !slices.Equal(got, []string{"b2"}) {
		t.Fatalf("Candidates = %q, want b2 only", got)
	}
	if got := names(f.Healthy(nil)); !slices.Equal(got, []string{"b2"}) {
		t.Fatalf("Healthy = %q, want b2 only", got)
	}
	dst := make([]*Backend, 0, 3)
	if n := testing.AllocsPerRun(100, func() { dst = f.Candidates(dst[:0], "m") }); n != 0 {
		t.Errorf("Candidates allocates %v times per call with a backoff set", n)
	}
	clock.Advance(10*time.Second - time.Nanosecond)
	if got := cands(); !slices.Equal(got, []string{"b2"}) {
		t.Fatalf("Candidates = %q before the backoff's end, want b2 only", got)
	}
	clock.Advance(time.Nanosecond)
	if got := cands(); !slices.Equal(got, []string{"b1", "b2"}) {
		t.Fatalf("Candidates = %q after the backoff, want b1 b2", got)
	}

	// A backoff is capped at MaxEjectionTime.
	f.Backoff(bs[2], clock.Now().Add(24*time.Hour))
	clock.Advance(DefaultMaxEjectionTime)
	if got := cands(); !slices.Equal(got, []string{"b1", "b2"}) {
		t.Fatalf("Candidates = %q after MaxEjectionTime, want b1 b2", got)
	}
	// Past or zero times do nothing.
	f.Backoff(bs[2], clock.Now())
	f.Backoff(bs[2], time.Time{})
	if got := cands(); !slices.Equal(got, []string{"b1", "b2"}) {
		t.Fatalf("Candidates = %q, want b1 b2", got)
	}

	// Ready counts backends that are healthy, discovered and not ejected; a
	// backoff does not make a backend unready.
	f.Backoff(bs[1], clock.Now().Add(time.Minute))
	if !f.Ready() {
		t.Error("not Ready")
	}
	bs[2].SetHealthy(false)
	if !f.Ready() {
		t.Error("not Ready with a backed-off backend in")
	}
	bs[1].SetHealthy(false)
	if f.Ready() {
		t.Error("Ready with the only healthy backend ejected")
	}

	// Foreign backends are ignored.
	foreign := NewBackend(0, "foreign", &url.URL{Scheme: "http", Host: "10.9.9.9:1"})
	report(f, foreign, repeat(gatewayErr, 10)...)
	f.Backoff(foreign, clock.Now().Add(time.Minute))
	if f.Ejected(foreign) {
		t.Error("a foreign backend is ejected")
	}
	if n := logs.count("backend ejected"); n != 1 {
		t.Errorf("logged %d ejections, want 1", n)
	}
}

func TestOutlierMetrics(t *testing.T) {
	clock := newFakeClock()
	f, bs, _, _ := healthyFleet(t, 3, Options{}, clock)
	c := f.Collector()
	metricNames := []string{"kvroute_backend_up", "kvroute_backend_ejected", "kvroute_backend_ejections_total",
		"kvroute_backend_ejections_refused_total"}
	want := func(up, ejected [3]int, ejections [3][numReasons]int, refused [3]int) string {
		var s strings.Builder
		s.WriteString("# HELP kvroute_backend_ejected 1 while outlier detection has the backend ejected.\n")
		s.WriteString("# TYPE kvroute_backend_ejected gauge\n")
		for i := range 3 {
			fmt.Fprintf(&s, "kvroute_backend_ejected{backend=\"b%d\"} %d\n", i, ejected[i])
		}
		s.WriteString("# HELP kvroute_backend_ejections_refused_total Ejections refused because MaxEjectionPercent of the fleet was already ejected (once per failure streak).\n")
		s.WriteString("# TYPE kvroute_backend_ejections_refused_total counter\n")
		for i := range 3 {
			fmt.Fprintf(&s, "kvroute_backend_ejections_refused_total{backend=\"b%d\"} %d\n", i, refused[i])
		}
		s.WriteString("# HELP kvroute_backend_ejections_total Outlier ejections, by reason: gateway, 5xx, timeout or slow (first tokens far slower than predicted).\n")
		s.WriteString("# TYPE kvroute_backend_ejections_total counter\n")
		for i := range 3 {
			for r := range numReasons {
				fmt.Fprintf(&s, "kvroute_backend_ejections_total{backend=\"b%d\",reason=%q} %d\n", i, r, ejections[i][r])
			}
		}
		s.WriteString("# HELP kvroute_backend_up 1 when the backend is in rotation: healthy and not ejected.\n")
		s.WriteString("# TYPE kvroute_backend_up gauge\n")
		for i := range 3 {
			fmt.Fprintf(&s, "kvroute_backend_up{backend=\"b%d\"} %d\n", i, up[i])
		}
		return s.String()
	}
	check := func(t *testing.T, expected string) {
		t.Helper()
		if err := testutil.CollectAndCompare(c, strings.NewReader(expected), metricNames...); err != nil {
			t.Error(err)
		}
	}

	t.Run("at start", func(t *testing.T) {
		check(t, want([3]int{1, 1, 1}, [3]int{}, [3][numReasons]int{}, [3]int{}))
	})
	t.Run("ejected and refused", func(t *testing.T) {
		report(f, bs[0], repeat(slowFirst, 5)...)
		report(f, bs[1], repeat(timeout, 3)...) // refused: one of three is the cap
		bs[2].SetHealthy(false)
		check(t, want([3]int{0, 1, 0}, [3]int{1, 0, 0},
			[3][numReasons]int{{reasonSlow: 1}}, [3]int{0, 1, 0}))
	})
	t.Run("returned and ejected again", func(t *testing.T) {
		bs[2].SetHealthy(true)
		clock.Advance(DefaultBaseEjectionTime)
		f.healthRound(t.Context())
		report(f, bs[0], repeat(serverErr, 5)...)
		check(t, want([3]int{0, 1, 1}, [3]int{1, 0, 0},
			[3][numReasons]int{{reasonSlow: 1, reason5xx: 1}}, [3]int{0, 1, 0}))
	})
	if n, err := testutil.GatherAndCount(registryOf(t, c)); err != nil || n != 3*(3+int(numReasons)) {
		t.Errorf("GatherAndCount = %d, %v; want %d series", n, err, 3*(3+int(numReasons)))
	}
}

// Reports, backoffs, returns, picks and scrapes all at once: run with -race.
func TestReportConcurrent(t *testing.T) {
	clock := newFakeClock()
	f, bs, _ := newOutlierFleet(t, 4, Options{}, clock)
	kinds := []Result{success, gatewayErr, serverErr, timeout, overloaded, slowFirst, fastFirst}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				b := bs[(g+i)%len(bs)]
				f.Report(b, kinds[(g*7+i)%len(kinds)])
				switch i % 50 {
				case 0:
					f.Backoff(b, clock.Now().Add(time.Second))
				case 1:
					clock.Advance(time.Second)
				case 2:
					f.readmit(f.member(b), clock.Now())
				case 3:
					_ = testutil.CollectAndCount(f.Collector())
				}
				_ = f.Candidates(nil, "m")
				_ = f.Ready()
			}
		})
	}
	wg.Wait()
	ejected := 0
	for _, b := range bs {
		if f.Ejected(b) {
			ejected++
		}
	}
	if got := int(f.out.ejected.Load()); got != ejected || ejected > 2 {
		t.Errorf("fleet counts %d ejected, %d are; the cap is 2", got, ejected)
	}
}

func BenchmarkReport(b *testing.B) {
	f, bs, _ := newOutlierFleet(b, 8, Options{}, newFakeClock())
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			f.Report(bs[i%len(bs)], fastFirst)
			i++
		}
	})
}

// registryOf returns a pedantic registry (it checks the collector's
// descriptions against what it collects) holding c.
func registryOf(t *testing.T, c prometheus.Collector) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	return reg
}
