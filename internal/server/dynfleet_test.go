package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/fleet"
)

// countedEmulator is an in-process emulator that counts the completions it
// starts and finishes.
type countedEmulator struct {
	emu               *emulator.Server
	srv               *httptest.Server
	started, finished atomic.Int64
	firstAt           atomic.Int64 // unix nanoseconds of the first completion since reset
}

func (c *countedEmulator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/chat/completions" {
		c.started.Add(1)
		c.firstAt.CompareAndSwap(0, time.Now().UnixNano())
		defer c.finished.Add(1)
	}
	c.emu.ServeHTTP(w, r)
}

func (c *countedEmulator) inFlight() int64 { return c.started.Load() - c.finished.Load() }

func (c *countedEmulator) port() uint16 {
	u, _ := url.Parse(c.srv.URL)
	p, _ := strconv.Atoi(u.Port())
	return uint16(p)
}

// srvResolver answers one SRV name with the ports it is given, every target
// on 127.0.0.1.
type srvResolver struct {
	mu    sync.Mutex
	ports []uint16
}

func (r *srvResolver) set(ports ...uint16) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ports = ports
}

func (r *srvResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	return []string{"127.0.0.1"}, nil
}

func (r *srvResolver) LookupSRV(_ context.Context, _, _, name string) (string, []*net.SRV, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*net.SRV
	for i, p := range r.ports {
		out = append(out, &net.SRV{Target: fmt.Sprintf("pod-%d.%s.", i, name), Port: p})
	}
	return name, out, nil
}

// TestFleetGrowsAndShrinksUnderLoad runs kvroute with discovery in front of
// four in-process emulators under steady streaming load: the fleet grows
// from two backends to four and back through the config file (polled, then
// reloaded as on SIGHUP) and then through DNS (SRV answers that change).
// No client sees an error, the removed backends' requests in flight at
// their removal finish, and added backends take requests within one
// resync interval.
func TestFleetGrowsAndShrinksUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("runs emulators for seconds")
	}
	const (
		fileEvery = 200 * time.Millisecond
		dnsEvery  = 200 * time.Millisecond
		// slack covers admitting a new backend (a probe, a scrape and
		// discovery on loopback) and the first request's routing.
		slack = time.Second
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	emus := make([]*countedEmulator, 4)
	var model string
	for i := range emus {
		e, err := emulator.New(emulator.Config{Seed: uint64(i + 1), TimeScale: 0.5, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		go e.Run(ctx)
		c := &countedEmulator{emu: e}
		c.srv = httptest.NewServer(c)
		defer c.srv.Close()
		emus[i], model = c, e.Model()
	}
	file := filepath.Join(t.TempDir(), "kvroute.yaml")
	writeBackends := func(idx ...int) {
		t.Helper()
		var sb strings.Builder
		sb.WriteString("backends:\n")
		for _, i := range idx {
			fmt.Fprintf(&sb, "  - name: e%d\n    url: %s\n", i, emus[i].srv.URL)
		}
		// Write then rename: a poll never reads half a file.
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(sb.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	writeBackends(0, 1)
	res := &srvResolver{}
	d, err := discovery.New(discovery.Config{File: file, FileInterval: fileEvery,
		DNS: []string{"_http._tcp.gpus"}, DNSInterval: dnsEvery, Resolver: res, Logger: fleetLogger()})
	if err != nil {
		t.Fatal(err)
	}
	s := startDiscovered(t, ctx, d)

	// Steady streaming load from six clients until the end.
	defer steadyLoad(t, s.URL, model, "tell me about the fleet ", 6)()

	// grown checks that the added backends are candidates within one
	// resync interval (plus the slack) of the change, and take requests.
	grown := func(how string, every time.Duration, change func(), added ...int) {
		t.Helper()
		for _, i := range added {
			emus[i].firstAt.Store(0)
		}
		candidate := func(i int) bool {
			for _, b := range s.Fleet.Candidates(nil, model) {
				if b.URL.String() == emus[i].srv.URL {
					return true
				}
			}
			return false
		}
		at := time.Now()
		change()
		for _, i := range added {
			waitWithin(t, fmt.Sprintf("%s: e%d a candidate", how, i), every+slack, func() bool { return candidate(i) })
		}
		ready := time.Since(at)
		for _, i := range added {
			// The policy chooses among the candidates: a new backend,
			// empty and idle, is soon the cheapest.
			waitWithin(t, fmt.Sprintf("%s: e%d takes requests", how, i), 10*time.Second, func() bool { return emus[i].firstAt.Load() != 0 })
			t.Logf("%s: e%d a candidate within %v, its first request %v after the change", how, i, ready.Round(time.Millisecond),
				time.Unix(0, emus[i].firstAt.Load()).Sub(at).Round(time.Millisecond))
		}
	}
	// shrunk removes backends while each has requests in flight, and
	// checks that those finish and that no request reaches them after.
	shrunk := func(how string, change func(), removed ...int) {
		t.Helper()
		for _, i := range removed {
			waitWithin(t, fmt.Sprintf("%s: e%d busy", how, i), 10*time.Second, func() bool { return emus[i].inFlight() > 0 })
		}
		gone := func() bool {
			for _, b := range s.Fleet.Backends() {
				for _, i := range removed {
					if b.URL.String() == emus[i].srv.URL {
						return false
					}
				}
			}
			return true
		}
		busy, finished := make([]int64, len(emus)), make([]int64, len(emus))
		for _, i := range removed {
			busy[i], finished[i] = emus[i].inFlight(), emus[i].finished.Load()
		}
		change()
		waitWithin(t, how+": removed from the fleet", 10*time.Second, gone)
		started := make([]int64, len(emus))
		for _, i := range removed {
			started[i] = emus[i].started.Load()
		}
		for _, i := range removed {
			waitWithin(t, fmt.Sprintf("%s: e%d's requests in flight finish", how, i), 10*time.Second,
				func() bool { return emus[i].inFlight() == 0 })
			// Every request in flight at the change finished (and the
			// clients saw no error: checked at the end).
			if n := emus[i].finished.Load() - finished[i]; n < busy[i] {
				t.Errorf("%s: e%d finished %d requests of the %d in flight at its removal", how, i, n, busy[i])
			}
			t.Logf("%s: e%d removed with %d requests in flight; %d finished after", how, i, busy[i], emus[i].finished.Load()-finished[i])
			// Requests routed just before the removal may arrive just
			// after it; none is routed there later.
			if n := emus[i].started.Load() - started[i]; n > 2 {
				t.Errorf("%s: e%d received %d requests after its removal", how, i, n)
			}
		}
	}
	time.Sleep(300 * time.Millisecond) // load on the first two

	// The file, polled: 2 → 4, then SIGHUP's Reload: 4 → 2 (e0 and e1 go).
	grown("file", fileEvery, func() { writeBackends(0, 1, 2, 3) }, 2, 3)
	shrunk("file", func() { writeBackends(2, 3); d.Reload() }, 0, 1)
	if n := len(s.Fleet.Backends()); n != 2 {
		t.Errorf("after the file shrank: %d backends, want 2", n)
	}

	// DNS: the SRV answer adds e0 and e1 back (as new backends, named
	// after their addresses), then drops them.
	grown("dns", dnsEvery, func() { res.set(emus[0].port(), emus[1].port()) }, 0, 1)
	if n := len(s.Fleet.Backends()); n != 4 {
		t.Errorf("after DNS grew: %d backends, want 4", n)
	}
	for _, b := range s.Fleet.Backends() {
		if b.Index < 2 && strings.HasPrefix(b.Name, "127.0.0.1:") {
			t.Errorf("re-added %s reuses index %d", b.Name, b.Index)
		}
	}
	shrunk("dns", func() { res.set() }, 0, 1)
	if n := len(s.Fleet.Backends()); n != 2 {
		t.Errorf("after DNS shrank: %d backends, want 2", n)
	}
	time.Sleep(300 * time.Millisecond) // load on the last two
}

// streamOnce sends one streaming completion and reads it to the end; it
// returns what went wrong, or "".
func streamOnce(client *http.Client, base, body string) string {
	res, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err.Error()
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	switch {
	case err != nil:
		return fmt.Sprintf("reading the stream: %v", err)
	case res.StatusCode != http.StatusOK:
		return fmt.Sprintf("%d: %s", res.StatusCode, data)
	case strings.Contains(string(data), `"error"`):
		return fmt.Sprintf("error event: %s", data)
	case !strings.Contains(string(data), "data: [DONE]"):
		return "stream without [DONE]"
	}
	return ""
}

func fleetLogger() *slog.Logger {
	if os.Getenv("KVROUTE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.DiscardHandler)
}

// TestEmptyFleetAtStart starts with a DNS name that has no addresses yet:
// the router serves, unready, and answers 503 until a backend appears.
func TestEmptyFleetAtStart(t *testing.T) {
	d, err := discovery.New(discovery.Config{DNS: []string{"_http._tcp.none"}, Resolver: &srvResolver{}, Logger: fleetLogger()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(t.Context(), Config{Discovery: d, Policy: "kvroute", Listen: "127.0.0.1:0", DrainDelay: -1, Logger: fleetLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tt := range []struct{ method, path, body string }{
		{http.MethodGet, "/readyz", ""},
		{http.MethodPost, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
	} {
		req, _ := http.NewRequest(tt.method, s.URL+tt.path, strings.NewReader(tt.body))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("%s %s with no backends = %d, want 503", tt.method, tt.path, res.StatusCode)
		}
	}
}

// steadyLoad streams chat requests (prompts of topic) from clients
// goroutines against url until the returned stop, which waits for them and
// fails t if any request failed.
func steadyLoad(t *testing.T, url, model, topic string, clients int) (stop func()) {
	var (
		requests, failures atomic.Int64
		errMu              sync.Mutex
		firstErr           string
		wg                 sync.WaitGroup
	)
	done := make(chan struct{})
	client := &http.Client{Timeout: 30 * time.Second}
	for g := range clients {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"client %d turn %d: %s"}],"max_tokens":40,"stream":true}`,
					model, g, i, strings.Repeat(topic, 20))
				requests.Add(1)
				if msg := streamOnce(client, url, body); msg != "" {
					failures.Add(1)
					errMu.Lock()
					if firstErr == "" {
						firstErr = msg
					}
					errMu.Unlock()
				}
			}
		})
	}
	return func() {
		close(done)
		wg.Wait()
		if n := failures.Load(); n > 0 {
			t.Errorf("%d of %d client requests failed; the first: %s", n, requests.Load(), firstErr)
		}
		t.Logf("%d requests", requests.Load())
	}
}

// startDiscovered starts kvroute on the backends d discovers, stopped at
// the test's end, and checks that it starts with two.
func startDiscovered(t *testing.T, ctx context.Context, d *discovery.Discovery) *Server {
	t.Helper()
	s, err := Start(ctx, Config{Discovery: d, Policy: "kvroute", Listen: "127.0.0.1:0", DrainDelay: -1,
		Fleet:  fleet.Options{HealthInterval: 100 * time.Millisecond, ScrapeInterval: 200 * time.Millisecond},
		Logger: fleetLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if n := len(s.Fleet.Backends()); n != 2 {
		t.Fatalf("fleet starts with %d backends, want 2", n)
	}
	return s
}

// waitWithin polls ok, state no event announces, until it holds; it fails
// t if that takes longer than within.
func waitWithin(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
