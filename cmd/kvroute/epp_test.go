package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestParseEppFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(t *testing.T, c eppConfig)
	}{
		{name: "endpoints", args: []string{"--endpoint", "10.0.0.1:8000", "--endpoint", "10.0.0.2:8000", "--fallbacks", "1"},
			check: func(t *testing.T, c eppConfig) {
				if n := len(c.server.Backends); n != 2 || c.server.Backends[1].URL.String() != "http://10.0.0.2:8000" {
					t.Errorf("backends %v", c.server.Backends)
				}
				if c.server.GRPCListen != ":9002" || c.server.Picker.Fallbacks != 1 || !c.server.Picker.IncludeUsage {
					t.Errorf("config %+v", c.server)
				}
			}},
		{name: "none", args: nil, wantErr: "no endpoints"},
		{name: "pool", args: []string{"--pool-name", "vllm-llama3-8b", "--pool-namespace", "ai"},
			check: func(t *testing.T, c eppConfig) {
				p := c.discovery.pool()
				if p == nil || p.Name != "vllm-llama3-8b" || p.Namespace != "ai" || p.Group != "inference.networking.k8s.io" {
					t.Errorf("pool %+v", p)
				}
				if !c.discovery.enabled() || len(c.server.Backends) != 0 {
					t.Errorf("discovery %+v, backends %v", c.discovery, c.server.Backends)
				}
			}},
		{name: "pool in the default namespace", args: []string{"--pool-name", "p"},
			check: func(t *testing.T, c eppConfig) {
				if p := c.discovery.pool(); p == nil || p.Namespace != "default" {
					t.Errorf("pool %+v", p)
				}
			}},
		{name: "service", args: []string{"--k8s-service", "ai/vllm", "--k8s-port-name", "http"},
			check: func(t *testing.T, c eppConfig) {
				if k := c.discovery.kubernetes(); k == nil || k.Service != "vllm" || k.PortName != "http" {
					t.Errorf("kubernetes %+v", k)
				}
			}},
		{name: "bad pool name", args: []string{"--pool-name", "Bad_Name"}, wantErr: "--pool-name"},
		{name: "bad dns", args: []string{"--dns", "vllm:99999"}, wantErr: "--dns"},
		{name: "response pins off", args: []string{"--endpoint", "10.0.0.1:80", "--response-pins", "0"},
			check: func(t *testing.T, c eppConfig) {
				if c.server.Router.ResponsePins != -1 {
					t.Errorf("ResponsePins %d, want -1 (none)", c.server.Router.ResponsePins)
				}
			}},
		{name: "negative response pins", args: []string{"--endpoint", "10.0.0.1:80", "--response-pins", "-5"}, wantErr: "--response-pins"},
		{name: "not ip:port", args: []string{"--endpoint", "10.0.0.1"}, wantErr: "want ip:port"},
		{name: "twice", args: []string{"--endpoint", "10.0.0.1:80", "--backend", "http://10.0.0.1"}, wantErr: "given twice"},
		{name: "unknown policy", args: []string{"--endpoint", "10.0.0.1:80", "--policy", "nope"}, wantErr: "unknown policy"},
		{name: "negative fallbacks", args: []string{"--endpoint", "10.0.0.1:80", "--fallbacks", "-1"}, wantErr: "--fallbacks"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseEppFlags(tt.args, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

func TestRunEppHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"epp", "-h"}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "-grpc-listen") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

// TestRunPickerFollowsConfigFile runs `kvroute epp --config FILE` in this
// process: while the file lists only an endpoint that does not answer the
// picker is not ready; once it lists an emulator, its gRPC readiness turns
// SERVING without a restart.
func TestRunPickerFollowsConfigFile(t *testing.T) {
	urls := startEmulators(t, 1) // serve_test.go
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(file, []byte("backends:\n  - {name: dead, url: "+deadURL(t)+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseEppFlags([]string{"--config", file, "--config-interval", "50ms", "--health-interval", "50ms",
		"--grpc-listen", "127.0.0.1:0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan string, 1), make(chan error, 1)
	go func() { done <- runPicker(ctx, cfg, slog.New(slog.DiscardHandler), ready) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("runPicker: %v", err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	status := func() healthpb.HealthCheckResponse_ServingStatus {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetStatus()
	}
	if s := status(); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("readiness %v with no endpoint answering, want NOT_SERVING", s)
	}
	tmp := file + ".new"
	if err := os.WriteFile(tmp, []byte("backends:\n  - {name: gpu0, url: "+urls[0]+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); status() != healthpb.HealthCheckResponse_SERVING; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the picker never became ready after the file listed an endpoint")
		}
	}
}
