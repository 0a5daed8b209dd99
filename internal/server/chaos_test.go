//go:build unix

package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/testfleet"
	"github.com/kvroute/kvroute/internal/upstream"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testfleet.Cleanup()
	os.Exit(code)
}

// Timeouts of the chaos tests: short, so that the faults show within
// seconds, and far above what a healthy emulator takes.
const (
	firstTokenFloor = 3 * time.Second
	idleTimeout     = 2 * time.Second
	// patience bounds the router's health probes and its dials to the
	// backends, and TestChaosKill's first tokens: tolerances here, not
	// what the tests check (a killed backend refuses connections and
	// resets those it had at once). At the start of TestChaosKill's 200
	// streams, under the race detector on two loaded cores, probes of live
	// emulators took up to 0.74 s at load 12 and over 1 s at load 15-20
	// (in CI), and at load 25 some dials took over 3 s and first tokens
	// over 3 s: with the defaults (1 s, 3 s) and firstTokenFloor, the
	// live backends left rotation too, and requests got "503 no healthy
	// backend", "502 unreachable (timed out)" or "504 no first token".
	patience = 30 * time.Second
)

// startRouter starts kvroute in front of the emulators; tweaks, if any,
// change its config first.
func startRouter(t *testing.T, emus []*testfleet.Backend, tweaks ...func(*Config)) *Server {
	t.Helper()
	transport := upstream.NewTransport()
	transport.DialContext = (&net.Dialer{Timeout: patience, KeepAlive: 30 * time.Second}).DialContext
	var bs []*fleet.Backend
	for i, e := range emus {
		b, err := fleet.ParseBackend(i, fmt.Sprintf("gpu%d=%s", i, e.URL()))
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	cfg := Config{
		Backends: bs, Policy: "kvroute", Listen: "127.0.0.1:0", DrainDelay: -1, Grace: 5 * time.Second,
		Fleet:  fleet.Options{HealthInterval: 100 * time.Millisecond, ScrapeInterval: 200 * time.Millisecond, Timeout: patience},
		Proxy:  proxy.Config{Transport: transport, Resilience: proxy.Resilience{FirstTokenFloor: firstTokenFloor, StreamIdleTimeout: idleTimeout}},
		Logger: testLogger(t),
	}
	for _, tweak := range tweaks {
		tweak(&cfg)
	}
	s, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if !s.Fleet.Ready() {
		t.Fatal("the router is not ready")
	}
	return s
}

// outcome is how one request ended, as its client saw it.
type outcome struct {
	status       int
	body         string // the body of a non-200 answer
	firstByte    bool   // some of the body arrived
	done         bool   // the stream ended with [DONE]
	errorEvent   bool   // an error event came
	transportErr error  // the connection failed
	backend      string
	elapsed      time.Duration
}

// silentlyCut reports whether the request broke off with no error event: a
// client could take it for a whole answer, or sees only a dropped
// connection.
func (o outcome) silentlyCut() bool {
	return o.status == 200 && !o.errorEvent && (o.transportErr != nil || !o.done)
}

// stream sends one streamed chat request and reads it to its end.
func stream(url string, maxTokens int, text string) outcome {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true}`,
		model, text, maxTokens)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return outcome{transportErr: err, elapsed: time.Since(start)}
	}
	defer res.Body.Close()
	o := outcome{status: res.StatusCode, backend: res.Header.Get(proxy.HeaderBackend)}
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		o.body = string(b)
		o.elapsed = time.Since(start)
		return o
	}
	rd := bufio.NewReader(res.Body)
	for {
		line, err := rd.ReadString('\n')
		if line != "" {
			o.firstByte = true
		}
		switch {
		case strings.HasPrefix(line, `data: {"error"`):
			o.errorEvent = true
		case strings.HasPrefix(line, "data: [DONE]"):
			o.done = true
		}
		if err != nil {
			if err != io.EOF {
				o.transportErr = err
			}
			break
		}
	}
	o.elapsed = time.Since(start)
	return o
}

// model is what the emulators serve (the default profile's).
var model = func() string {
	p, _ := emulator.New(emulator.Config{})
	return p.Model()
}()

// many sends n streams at once and returns their outcomes; after has them
// under way.
func many(url string, n, maxTokens int, after func()) []outcome {
	out := make([]outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i] = stream(url, maxTokens, fmt.Sprintf("request %d: tell me a long story", i)) })
	}
	if after != nil {
		after()
	}
	wg.Wait()
	return out
}

// checkNothingLost: every request got a whole answer, or, if its backend
// failed once part of it was sent, an error event to end it; none failed
// before its first byte (those are retried), none was cut silently.
func checkNothingLost(t *testing.T, outs []outcome) (cut int) {
	t.Helper()
	for i, o := range outs {
		switch {
		case o.transportErr != nil && !o.firstByte, o.status != 200:
			t.Errorf("request %d failed before its first byte: status %d %s %v", i, o.status, o.body, o.transportErr)
		case o.silentlyCut():
			t.Errorf("request %d was cut with no error event (err %v)", i, o.transportErr)
		case o.errorEvent:
			cut++
		}
	}
	return cut
}

// noMigration turns the migration of cut streams off (migrate_test.go
// tests it), so that the error event that ends a cut stream is tested.
func noMigration(c *Config) { c.Proxy.Resilience.MaxMigrations = -1 }

// SIGKILL of one of three backends under 200 streams, without migration:
// no request that had not received a byte fails, every stream cut ends
// with the error event.
func TestChaosKill(t *testing.T) {
	emus := testfleet.Start(t, 3, "--seed", "1")
	base := baseline()
	s := startRouter(t, emus, func(c *Config) { c.Proxy.Resilience.FirstTokenFloor = patience }, noMigration)
	outs := many(s.URL, 200, 300, func() {
		waitFor(t, func() bool { return inflight(s, 0) > 10 })
		time.Sleep(500 * time.Millisecond) // under way: past their first tokens
		emus[0].Kill()
	})
	cut := checkNothingLost(t, outs)
	t.Logf("200 streams, backend 0 killed under them: %d cut with an error event", cut)
	if cut == 0 {
		t.Error("no stream was cut: the kill came after they ended, the test proves nothing")
	}
	s.Close()
	checkBaseline(t, base)
}

// A backend that answers 500 to everything gets at most 5 requests before
// it is ejected, and no client sees a 500.
func TestChaos500(t *testing.T) {
	emus := testfleet.Start(t, 3, "--seed", "2", "--time-scale", "0.1")
	emus[1].SetFaults(emulator.Faults{Rate500: 1})
	s := startRouter(t, emus)
	for i := range 40 {
		o := stream(s.URL, 5, fmt.Sprintf("short %d", i))
		if o.status != 200 || !o.done {
			t.Fatalf("request %d: %+v", i, o)
		}
	}
	t.Logf("the 500-answering backend got %v requests", faultsServed(t, emus[1], "500"))
	if n := faultsServed(t, emus[1], "500"); n > 5 {
		t.Errorf("the 500-answering backend got %v requests, want at most 5 before ejection", n)
	}
	if n := faultsServed(t, emus[1], "500"); n == 5 && !s.Fleet.Ejected(s.Fleet.Backends()[1]) {
		t.Error("5 failures in a row, yet not ejected")
	}
}

// A backend whose generations hang delays a request by no more than the
// first-token timeout, and hangs none.
func TestChaosHang(t *testing.T) {
	emus := testfleet.Start(t, 3, "--seed", "3", "--time-scale", "0.1")
	emus[2].SetFaults(emulator.Faults{Hang: true})
	s := startRouter(t, emus)
	outs := many(s.URL, 30, 20, nil)
	checkNothingLost(t, outs)
	limit := firstTokenFloor + 5*time.Second // the deadline, and the request's own time
	for i, o := range outs {
		if o.elapsed > limit {
			t.Errorf("request %d took %v, more than the first-token timeout allows", i, o.elapsed)
		}
	}
	if n := faultsServed(t, emus[2], "hang"); n == 0 {
		t.Error("no request reached the hung backend: the test proves nothing")
	}
}

// Without migration, a SIGSTOPped backend's streams end with the error
// event within the idle timeout; the others finish.
func TestChaosStop(t *testing.T) {
	emus := testfleet.Start(t, 3, "--seed", "4")
	s := startRouter(t, emus, noMigration)
	var stoppedAt time.Time
	outs := many(s.URL, 30, 400, func() {
		waitFor(t, func() bool { return inflight(s, 0) > 3 })
		time.Sleep(300 * time.Millisecond) // under way: past the first token
		stoppedAt = time.Now()
		emus[0].Stop()
	})
	defer emus[0].Cont()
	cut := checkNothingLost(t, outs)
	if cut == 0 {
		t.Error("no stream was cut: the test proves nothing")
	}
	for i, o := range outs {
		if o.errorEvent && o.elapsed > time.Since(stoppedAt)+idleTimeout+5*time.Second {
			t.Errorf("stream %d ended %v after the stop", i, o.elapsed)
		}
	}
}

// Shutdown lets streams in flight finish within the grace and ends the
// rest with the error event; /readyz turns 503 at once.
func TestShutdownDrains(t *testing.T) {
	emus := testfleet.Start(t, 2, "--seed", "5")
	s := startRouter(t, emus)
	s.cfg.DrainDelay, s.cfg.Grace = 500*time.Millisecond, time.Second
	outs := many(s.URL, 10, 3000, func() {
		waitFor(t, func() bool { return inflight(s, 0)+inflight(s, 1) >= 10 })
		go s.Shutdown(context.Background())
		waitFor(t, func() bool {
			res, err := http.Get(s.URL + "/readyz")
			if err != nil {
				return false
			}
			res.Body.Close()
			return res.StatusCode == http.StatusServiceUnavailable
		})
	})
	if cut := checkNothingLost(t, outs); cut != 10 {
		t.Errorf("%d of 10 long streams ended with the error event at shutdown, want all", cut)
	}
}

// inflight is the router's count of requests in flight on backend i.
func inflight(s *Server, i int) int64 { return s.Fleet.Backends()[i].Load().Requests }

// faultsServed reads how many requests an emulator answered with fault.
func faultsServed(t *testing.T, e *testfleet.Backend, fault string) float64 {
	t.Helper()
	res, err := http.Get(e.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	m := regexp.MustCompile(`kvroute_emulator_faults_total\{[^}]*fault="` + fault + `"[^}]*\} (\S+)`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// waitFor polls cond until it holds, for at most 30 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 30 s")
		}
	}
}

type counts struct{ goroutines, fds int }

func baseline() counts {
	fds, _ := os.ReadDir("/proc/self/fd")
	return counts{runtime.NumGoroutine(), len(fds)}
}

// checkBaseline: goroutines and file descriptors come back to what they
// were (idle connections closed, every request's goroutines gone).
func checkBaseline(t *testing.T, base counts) {
	t.Helper()
	http.DefaultClient.CloseIdleConnections()
	var now counts
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if now = baseline(); now.goroutines <= base.goroutines+2 && now.fds <= base.fds+2 {
			return
		}
	}
	t.Errorf("goroutines %d, fds %d after the test; %d and %d before", now.goroutines, now.fds, base.goroutines, base.fds)
}

// testLogger discards the router's logs, unless KVROUTE_TEST_LOG is set:
// then they go to stderr.
func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("KVROUTE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}
