package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/internal/epp"
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
		{name: "header and metadata equal by default", args: []string{"--endpoint", "10.0.0.1:80"},
			check: func(t *testing.T, c eppConfig) {
				if c.server.Picker.OriginalDstHeader {
					t.Error("OriginalDstHeader set by default")
				}
			}},
		{name: "original-dst header", args: []string{"--endpoint", "10.0.0.1:80", "--original-dst-header"},
			check: func(t *testing.T, c eppConfig) {
				if !c.server.Picker.OriginalDstHeader {
					t.Error("--original-dst-header did not set OriginalDstHeader")
				}
			}},
		{name: "header-list false is original-dst", args: []string{"--endpoint", "10.0.0.1:80", "--header-list=false"},
			check: func(t *testing.T, c eppConfig) {
				if !c.server.Picker.OriginalDstHeader {
					t.Error("--header-list=false did not set OriginalDstHeader")
				}
			}},
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
// process: while the file lists only an endpoint that does not answer, the
// picker is ready (synced) and answers 503; once the file lists an
// emulator, requests go there, without a restart.
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
	if r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"}); err != nil ||
		r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("readiness %v, %v with no endpoint answering, want SERVING (synced; it answers 503)", r.GetStatus(), err)
	}
	ext := extprocv3.NewExternalProcessorClient(conn)
	// pick asks the picker where GET /v1/models goes: the destination, or
	// the status of its immediate response.
	pick := func() (dest string, status int) {
		st, err := ext.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer st.CloseSend()
		hs := []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("GET")}, {Key: ":path", RawValue: []byte("/v1/models")}}
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: true}}}); err != nil {
			t.Fatal(err)
		}
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ir := m.GetImmediateResponse(); ir != nil {
			return "", int(ir.GetStatus().GetCode())
		}
		for _, h := range m.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == epp.HeaderDestination {
				return string(h.GetHeader().GetRawValue()), 0
			}
		}
		t.Fatalf("reply %v names no destination", m)
		return "", 0
	}
	if dest, status := pick(); status != http.StatusServiceUnavailable {
		t.Fatalf("with no endpoint answering: destination %q, status %d; want 503", dest, status)
	}
	tmp := file + ".new"
	if err := os.WriteFile(tmp, []byte("backends:\n  - {name: gpu0, url: "+urls[0]+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
	want := strings.TrimPrefix(urls[0], "http://")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if dest, _ := pick(); dest == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("requests never went to %s after the file listed it", want)
		}
	}
}
