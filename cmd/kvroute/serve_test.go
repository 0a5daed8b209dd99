package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kvroute/kvroute/internal/testfleet"
)

func TestParseServeFlags(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(good, []byte("backends:\n  - name: a\n    url: http://127.0.0.1:9001\nscrape_interval: 2s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		wantErr  string
		backends int
	}{
		{"one backend", []string{"--backend", "http://127.0.0.1:9001"}, "", 1},
		{"named backends", []string{"--backend", "a=http://127.0.0.1:9001", "--backend", "b=http://127.0.0.1:9002"}, "", 2},
		{"config and flag", []string{"--config", good, "--backend", "b=http://127.0.0.1:9002"}, "", 2},
		{"config and flag name one server", []string{"--config", good, "--backend", "b=HTTP://127.0.0.1:9001/"}, "", 1},
		{"one server twice by flag", []string{"--backend", "http://localhost", "--backend", "b=http://LocalHost:80"}, "", 1},
		{"one host, two ports", []string{"--backend", "http://127.0.0.1:9001", "--backend", "http://127.0.0.1:9002"}, "", 2},
		{"one host, two paths", []string{"--backend", "http://127.0.0.1:9001/a", "--backend", "http://127.0.0.1:9001/b"}, "", 2},
		{"no backends", nil, "no backends", 0},
		{"duplicate names", []string{"--backend", "a=http://127.0.0.1:9001", "--backend", "a=http://127.0.0.1:9002"}, "twice", 0},
		{"bad url", []string{"--backend", "ftp://x"}, "", -1},
		{"unknown policy", []string{"--backend", "http://127.0.0.1:9001", "--policy", "nope"}, "unknown policy", 0},
		{"missing config", []string{"--config", filepath.Join(dir, "none.yaml")}, "none.yaml", 0},
		{"bad load factor", []string{"--backend", "http://127.0.0.1:9001", "--load-factor", "0.5"}, "load-factor", 0},
		{"stray argument", []string{"--backend", "http://127.0.0.1:9001", "extra"}, "unexpected", 0},
		{"dns only", []string{"--dns", "vllm.default.svc:8000", "--dns", "_http._tcp.sglang"}, "", 0},
		{"bad dns name", []string{"--dns", "vllm:http"}, "--dns", 0},
		{"bad dns interval", []string{"--dns", "vllm", "--dns-interval", "0s"}, "dns-interval", 0},
		{"k8s only", []string{"--k8s-service", "ai/vllm", "--k8s-port-name", "http"}, "", 0},
		{"bad k8s service", []string{"--k8s-service", "vllm"}, "--k8s-service", 0},
		{"peers", []string{"--backend", "http://127.0.0.1:9001", "--replicas", "3", "--peer", "http://10.0.0.2:9091", "--peer", "dns+http://kvroute-peers.ai.svc:9091"}, "", 1},
		{"peer without replicas", []string{"--backend", "http://127.0.0.1:9001", "--peer", "http://10.0.0.2:9091"}, "--replicas", 0},
		{"bad peer", []string{"--backend", "http://127.0.0.1:9001", "--replicas", "2", "--peer", "10.0.0.2:9091"}, "--peer", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseServeFlags(tt.args, io.Discard)
			switch {
			case tt.backends < 0:
				if err == nil {
					t.Fatal("want an error")
				}
			case tt.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			case len(cfg.backends) != tt.backends:
				t.Fatalf("%d backends, want %d", len(cfg.backends), tt.backends)
			}
		})
	}
}

// startServe runs `kvroute serve` with args in this process and returns its
// base URL.
func startServe(t *testing.T, args ...string) string {
	t.Helper()
	cfg, err := parseServeFlags(append([]string{"--listen", "127.0.0.1:0", "--health-interval", "50ms", "--metrics-listen", "", "--drain-delay", "0"}, args...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(slog.DiscardHandler), ready) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case addr := <-ready:
		return "http://" + addr
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	return ""
}

// startEmulators runs n emulated backends in this process.
func startEmulators(t *testing.T, n int) []string {
	t.Helper()
	cfg, err := parseEmulateFlags([]string{"--port", "0", "--replicas", strconv.Itoa(n), "--time-scale", "0.001", "--model", "m"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan []string, 1)
	done := make(chan error, 1)
	go func() { done <- emulate(ctx, cfg, slog.New(slog.DiscardHandler), func(u []string) { ready <- u }) }()
	t.Cleanup(func() { cancel(); <-done })
	return <-ready
}

// deadURL is the address of a port nobody listens on, nor can until the
// test ends (testfleet.DeadAddr).
func deadURL(t *testing.T) string { return "http://" + testfleet.DeadAddr(t) }

// freePort is a 127.0.0.1 address nobody listened on a moment ago, for a
// process the test starts there later (another may take it first).
func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

type chatReply struct {
	backend, route string
	status         int
	cached         int
	errType        string
}

func chat(t *testing.T, url, body string) chatReply {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
		Error *struct {
			Message, Type string
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("status %d, body not JSON: %v", resp.StatusCode, err)
	}
	out := chatReply{backend: resp.Header.Get("X-Kvroute-Backend"), route: resp.Header.Get("X-Kvroute-Route"),
		status: resp.StatusCode, cached: r.Usage.Details.Cached}
	if r.Error != nil {
		if r.Error.Message == "" {
			t.Errorf("status %d: error without a message", resp.StatusCode)
		}
		out.errType = r.Error.Type
	}
	return out
}

// The router end to end: a dead backend gets nothing, a conversation stays
// on its backend and hits its cache, and bad input gets OpenAI-shaped errors.
func TestServeEndToEnd(t *testing.T) {
	emus := startEmulators(t, 2)
	url := startServe(t, "--backend", "a="+emus[0], "--backend", "b="+emus[1], "--backend", "dead="+deadURL(t))

	system := strings.Repeat("You are a careful assistant who answers briefly. ", 80)
	turn1 := `{"model":"m","max_tokens":8,"messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"What is a KV cache?"}]}`
	first := chat(t, url, turn1)
	if first.status != 200 || first.backend == "dead" || first.backend == "" {
		t.Fatalf("turn 1: %+v", first)
	}
	for i := range 10 {
		r := chat(t, url, turn1)
		if r.status != 200 || r.backend != first.backend || r.route != "prefix" || r.cached == 0 {
			t.Fatalf("repeat %d: %+v, want 200 on %s by prefix with cached tokens", i, r, first.backend)
		}
	}
	tests := []struct {
		name, method, path, body string
		status                   int
	}{
		{"malformed JSON", "POST", "/v1/chat/completions", `{"model":`, 400},
		{"missing model", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, 400},
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 404},
		{"wrong method", "GET", "/v1/chat/completions", "", 405},
		{"unknown path", "GET", "/nope", "", 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, url+tt.path, strings.NewReader(tt.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e struct {
				Error struct {
					Message, Type string
				} `json:"error"`
			}
			if resp.StatusCode != tt.status || json.NewDecoder(resp.Body).Decode(&e) != nil || e.Error.Message == "" || e.Error.Type == "" {
				t.Errorf("status %d (want %d), error %+v", resp.StatusCode, tt.status, e.Error)
			}
		})
	}
	// serve discovers its backends before it listens: ready at once.
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/readyz = %d with two live backends", resp.StatusCode)
	}
}

// On SIGTERM serve says so and logs each step of the drain: an operator
// watching the logs knows why the router stopped answering.
func TestServeLogsTheDrainOnSIGTERM(t *testing.T) {
	urls := startEmulators(t, 1)
	cfg, err := parseServeFlags([]string{"--listen", "127.0.0.1:0", "--metrics-listen", "", "--drain-delay", "10ms",
		"--backend", urls[0]}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	ctx, stop := signalContext()
	defer stop()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, newLogger(&logs, logText, slog.LevelInfo), ready) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`msg="shutting down" signal="terminated signal received"`,
		`msg="draining: /readyz answers 503`, `msg="draining: no longer accepting`, `msg=stopped`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the logs lack %s:\n%s", want, logs.String())
		}
	}
}
