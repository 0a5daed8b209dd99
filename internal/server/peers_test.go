package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/peers"
	"github.com/kvroute/kvroute/internal/router/kvroute"
	"github.com/kvroute/kvroute/internal/router/policies"
)

// Two router replicas in front of one emulator: a stream through replica
// A shows up, over A's metrics listener, in replica B's count of the
// backend's load while it runs, and leaves it when it ends: pushed by A's
// stream (B's poll interval is then an hour, so nothing else can tell it),
// or polled.
func TestReplicasShareInFlightCounts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		push     bool
		interval time.Duration
	}{
		{"push", true, time.Hour},
		{"poll", false, 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) { testReplicasShare(t, tc.push, tc.interval) })
	}
}

func testReplicasShare(t *testing.T, push bool, interval time.Duration) {
	ctx := t.Context()
	emu := startPeersEmulator(t)

	start := func(metricsListen string, peerURLs ...string) *Server {
		b, err := fleet.ParseBackend(0, "gpu0="+emu.URL)
		if err != nil {
			t.Fatal(err)
		}
		s, err := Start(ctx, Config{
			Backends: []*fleet.Backend{b}, Policy: "kvroute", Listen: "127.0.0.1:0", MetricsListen: metricsListen,
			Router:     policies.Options{KVRoute: kvroute.Config{Replicas: 2}},
			Peers:      peers.Options{Peers: peerURLs, Interval: interval, Push: push},
			DrainDelay: -1, Logger: fleetLogger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	a := start("127.0.0.1:0")
	bRep := start("", a.MetricsURL)

	peerRequests := func() int64 {
		p := bRep.Fleet.Backends()[0].PeerLoad(time.Now(), time.Second)
		if p == nil {
			return -1
		}
		return p.Requests
	}
	waitWithin(t, "B hears A before any request", 10*time.Second, func() bool { return peerRequests() == 0 })

	done := make(chan string, 1)
	go func() {
		done <- streamOnce(http.DefaultClient, a.URL, fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"count to a thousand"}],"max_tokens":300,"stream":true}`, model))
	}()
	waitWithin(t, "A's stream counted by B", 10*time.Second, func() bool { return peerRequests() == 1 })
	if msg := <-done; msg != "" {
		t.Fatalf("the stream through A: %s", msg)
	}
	waitWithin(t, "A's finished stream gone from B's count", 10*time.Second, func() bool { return peerRequests() == 0 })

	// A serves its counts on its metrics listener, not on its API.
	res, err := http.Get(a.MetricsURL + peers.Path)
	if err != nil {
		t.Fatal(err)
	}
	var r peers.Report
	if err := json.NewDecoder(res.Body).Decode(&r); err != nil || res.StatusCode != 200 || r.Replica == "" {
		t.Errorf("A's report: status %d, %+v, %v", res.StatusCode, r, err)
	}
	res.Body.Close()
	res, err = http.Get(a.URL + peers.Path)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound {
		t.Errorf("A's API listener answered %s with %d, want 404 (it has a metrics listener)", peers.Path, res.StatusCode)
	}

	// B's metrics say how it heard: followers of A's stream, or polls.
	res, err = http.Get(bRep.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	streaming := strings.Contains(string(body), "kvroute_peers_streaming 1")
	if streaming != push {
		t.Errorf("B streaming from A: %v, want %v", streaming, push)
	}
}

// A server's shutdown ends its followers' streams at once instead of
// waiting for its grace period: the stream is on its API listener (no
// metrics listener), which Shutdown drains.
func TestShutdownEndsPeerStreams(t *testing.T) {
	ctx := t.Context()
	emu := startPeersEmulator(t)
	b, err := fleet.ParseBackend(0, "gpu0="+emu.URL)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(ctx, Config{
		Backends: []*fleet.Backend{b}, Policy: "kvroute", Listen: "127.0.0.1:0",
		Router:     policies.Options{KVRoute: kvroute.Config{Replicas: 2}},
		Peers:      peers.Options{Peers: []string{"http://127.0.0.1:1"}, Push: true},
		DrainDelay: -1, Grace: time.Hour, Logger: fleetLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res, err := http.Get(s.URL + peers.StreamPath)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	if err != nil || !strings.Contains(line, `"full":true`) {
		t.Fatalf("first line of the stream: %q, %v", line, err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second): // a bound on a hang: the grace is an hour
		t.Fatal("Shutdown waited on a peer's stream")
	}
}

// startPeersEmulator serves one emulated backend until the test ends.
func startPeersEmulator(t *testing.T) *httptest.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e, err := emulator.New(emulator.Config{Seed: 1, TimeScale: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	go e.Run(ctx)
	emu := httptest.NewServer(e)
	t.Cleanup(func() { emu.Close(); cancel() })
	return emu
}
