//go:build unix

package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/fleetpage"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/testfleet"
)

// chromium returns the path of a Chromium or Chrome binary. It skips the
// test when there is none, except under CI (CI=true), where .ci/run
// installs Debian's chromium and the test must run.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on PATH (.ci/run installs it under CI)")
	}
	t.Skip("no chromium on PATH: apt-get install chromium")
	return ""
}

// headless runs the browser headless on url, with budget of virtual time
// for the page's script (its polls), and returns the DOM it rendered; with
// screenshot, it writes a PNG there instead and returns nothing.
func headless(t *testing.T, browser, url, screenshot string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := []string{"--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
		"--no-first-run", "--user-data-dir=" + t.TempDir(), "--virtual-time-budget=4000"}
	if screenshot != "" {
		args = append(args, "--hide-scrollbars", "--window-size=1400,900", "--screenshot="+screenshot)
	} else {
		args = append(args, "--dump-dom")
	}
	cmd := exec.CommandContext(ctx, browser, append(args, url)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", browser, err, stderr.String())
	}
	return string(out)
}

// backendStates returns the state each backend row of a dumped fleet page
// shows, by name.
func backendStates(dom string) map[string]string {
	states := map[string]string{}
	for _, m := range regexp.MustCompile(`<tr data-backend="([^"]+)" data-state="([^"]+)"`).FindAllStringSubmatch(dom, -1) {
		states[m[1]] = m[2]
	}
	return states
}

// TestFleetPageInBrowser loads the fleet page in headless Chromium against
// a live fleet of emulators: every backend shows, with the decisions and
// their cost terms; one emulator is killed under streams, and once the
// health checks mark it down the page shows it down and the streams it
// served continued elsewhere. With FLEET_PAGE_SCREENSHOT=FILE it
// also writes the page's screenshot there (docs/fleet-page.png).
func TestFleetPageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts emulator processes and a browser")
	}
	browser := chromium(t)
	emus := testfleet.Start(t, 3, "--seed", "7")
	s := startRouter(t, emus, func(c *Config) {
		c.MetricsListen, c.FleetPage = "127.0.0.1:0", true
		c.Proxy.Security.MetricsElsewhere = true
	})
	if s.Page == nil {
		t.Fatal("no fleet page with FleetPage and a metrics listener")
	}
	// The API listener does not serve the page.
	if res, err := http.Get(s.URL + fleetpage.PagePath); err != nil {
		t.Fatal(err)
	} else if res.Body.Close(); res.StatusCode != http.StatusNotFound {
		t.Errorf("the API listener answers %s with %d, want 404", fleetpage.PagePath, res.StatusCode)
	}
	page := s.MetricsURL + fleetpage.PagePath
	get(t, s.MetricsURL+fleetpage.JSONPath) // the window starts here
	// Four conversations of six turns: prefix hits, and some spread.
	for i := range 24 {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":"You are agent %d. %s"},{"role":"user","content":"turn %d"}],"max_tokens":8,"stream":true}`,
			model, i%4, strings.Repeat("Keep the answer short. ", 40), i/4)
		res, err := http.Post(s.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", i, res.StatusCode)
		}
	}

	dom := headless(t, browser, page, "")
	states := backendStates(dom)
	for _, name := range []string{"gpu0", "gpu1", "gpu2"} {
		if states[name] != "up" {
			t.Errorf("before the kill the page shows %s as %q, want up (rows: %v)", name, states[name], states)
		}
	}
	for _, want := range []string{`data-loaded="true"`, "least-cost", "queued "} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if t.Failed() {
		t.Fatalf("page:\n%s", dom)
	}

	// Six long streams, spread over the three by their load; gpu1 is
	// killed once it decodes one.
	var streams sync.WaitGroup
	for i := range 6 {
		streams.Go(func() { streamChat(s.URL, fmt.Sprintf("stream %d: tell me a story", i), 300) })
	}
	waitFor(t, func() bool { return s.Fleet.Backends()[1].Load().Decoding > 0 })
	emus[1].Kill()
	streams.Wait()
	waitFor(t, func() bool { return !s.Fleet.Backends()[1].Healthy() })
	dom = headless(t, browser, page, "")
	states = backendStates(dom)
	if states["gpu1"] != "down" || states["gpu0"] != "up" || states["gpu2"] != "up" {
		t.Fatalf("after gpu1 was killed the page shows %v, want gpu1 down and the others up:\n%s", states, dom)
	}
	m := regexp.MustCompile(`<b>(\d+) / (\d+)</b><span>cut streams continued`).FindStringSubmatch(dom)
	if m == nil || m[1] == "0" {
		t.Fatalf("the page shows no stream continued after gpu1 was killed under one (%q):\n%s", m, dom)
	}

	shot := filepath.Join(t.TempDir(), "fleet.png")
	if dst := os.Getenv("FLEET_PAGE_SCREENSHOT"); dst != "" {
		shot = dst
	}
	headless(t, browser, page, shot)
	fi, err := os.Stat(shot)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() < 10_000 {
		t.Fatalf("screenshot %s: %d bytes, too small for the page", shot, fi.Size())
	}
}

// get reads url, failing t unless it answers 200.
func get(t *testing.T, url string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", url, res.StatusCode)
	}
}

// TestFleetPageJSON checks the page's wiring without a browser: /fleet.json
// on the metrics listener counts what the router served, the API listener
// does not serve it, and there is no page without a metrics listener.
func TestFleetPageJSON(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var bs []*fleet.Backend
	for i := range 2 {
		e, err := emulator.New(emulator.Config{Seed: uint64(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		go e.Run(ctx)
		ts := httptest.NewServer(e)
		defer ts.Close()
		b, _ := fleet.ParseBackend(i, fmt.Sprintf("gpu%d=%s", i, ts.URL))
		bs = append(bs, b)
	}
	cfg := Config{Backends: bs, Policy: "kvroute", Listen: "127.0.0.1:0", DrainDelay: -1, Logger: testLogger(t),
		Proxy: proxy.Config{Security: proxy.Security{MetricsElsewhere: true}}}
	bare, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	bare.Close()
	if bare.Page != nil {
		t.Error("a fleet page without FleetPage")
	}
	cfg.MetricsListen, cfg.FleetPage = "127.0.0.1:0", true
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	get(t, s.MetricsURL+fleetpage.JSONPath) // the window starts here
	for i := range 3 {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello %d"}],"max_tokens":4}`, model, i)
		res, err := http.Post(s.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	res, err := http.Get(s.MetricsURL + fleetpage.JSONPath)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var v fleetpage.View
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	served := 0
	for _, b := range v.Backends {
		served += int(b.ServedTotal)
	}
	if len(v.Backends) != 2 || len(v.Decisions) != 3 || served != 3 || v.Policy != "kvroute" {
		t.Errorf("view: %d backends, %d decisions, %d served, policy %q; want 2, 3, 3, kvroute", len(v.Backends), len(v.Decisions), served, v.Policy)
	}
	api, err := http.Get(s.URL + fleetpage.JSONPath)
	if err != nil {
		t.Fatal(err)
	}
	api.Body.Close()
	if api.StatusCode != http.StatusNotFound {
		t.Errorf("the API listener answers %s with %d, want 404", fleetpage.JSONPath, api.StatusCode)
	}
}
