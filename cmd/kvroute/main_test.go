package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
)

func TestRun(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		want       int
		wantStdout string
		wantStderr string
	}{
		{"no command", nil, 2, "", "Usage: kvroute"},
		{"unknown command", []string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{"help", []string{"help"}, 0, "emulate", ""},
		{"emulate help", []string{"emulate", "-h"}, 0, "", "--time-scale"},
		{"emulate bad flag", []string{"emulate", "--nope"}, 2, "", "flag provided but not defined"},
		{"emulate bad profile", []string{"emulate", "--profile", "tpu"}, 2, "", `unknown profile "tpu"`},
		{"sim block size not a power of two", []string{"sim", "--block-size", "100"}, 2, "", "--block-size must be a power of two"},
		{"bench real servers with emulator flags", []string{"bench", "--backend-url", "http://127.0.0.1:1", "--backends", "3"}, 2, "",
			"--backends describes emulated backends"},
		{"bench real servers that are down", []string{"bench", "--backend-url", "http://127.0.0.1:1", "--workload", "small-chat",
			"--policies", "round-robin", "--out", "/dev/null/x"}, 1, "", "is not up"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if got := run(tt.args, &stdout, &stderr); got != tt.want {
				t.Errorf("exit %d, want %d; stderr %q", got, tt.want, stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.wantStdout) {
				t.Errorf("stdout %q lacks %q", stdout.String(), tt.wantStdout)
			}
			if !strings.Contains(strings.ReplaceAll(stderr.String(), "  -", "  --"), tt.wantStderr) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tt.wantStderr)
			}
		})
	}
}

func TestParseEmulateFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		check   func(t *testing.T, c emulateConfig)
		wantErr string
	}{
		{name: "defaults", args: nil, check: func(t *testing.T, c emulateConfig) {
			p := c.server.Profile
			if c.host != "127.0.0.1" || c.port != 8001 || c.replicas != 1 || c.logLevel != slog.LevelInfo ||
				c.server.TimeScale != 1 || c.server.Model != "" || p.Name != "h100-llama3-8b" ||
				p.NumGPUBlocks != 0 || p.MaxModelLen != 131072 {
				t.Errorf("%+v", c)
			}
		}},
		{name: "overrides", args: []string{"--port", "9000", "--host", "0.0.0.0", "--replicas", "4",
			"--model", "m", "--profile", "4xh100-llama3-70b", "--kv-blocks", "5000", "--block-size", "32",
			"--max-num-seqs", "8", "--max-num-batched-tokens", "2048", "--time-scale", "0.1", "--seed", "7",
			"--log-level", "debug"},
			check: func(t *testing.T, c emulateConfig) {
				p := c.server.Profile
				if c.host != "0.0.0.0" || c.port != 9000 || c.replicas != 4 || c.logLevel != slog.LevelDebug ||
					c.server.Model != "m" || c.server.TimeScale != 0.1 || c.server.Seed != 7 ||
					p.Name != "4xh100-llama3-70b" || p.NumGPUBlocks != 5000 || p.BlockSize != 32 ||
					p.MaxNumSeqs != 8 || p.MaxNumBatchedTokens != 2048 || p.MaxModelLen != 131072 {
					t.Errorf("%+v", c)
				}
			}},
		{name: "small cache shrinks the context", args: []string{"--kv-blocks", "100"},
			check: func(t *testing.T, c emulateConfig) {
				if got := c.server.Profile.MaxModelLen; got != 1600 {
					t.Errorf("max_model_len %d, want 1600", got)
				}
			}},
		{name: "explicit context is kept", args: []string{"--kv-blocks", "100", "--max-model-len", "4000"},
			check: func(t *testing.T, c emulateConfig) {
				if got := c.server.Profile.MaxModelLen; got != 4000 {
					t.Errorf("max_model_len %d, want 4000", got)
				}
			}},
		{name: "faults", args: []string{"--fault-hang", "--fault-hang-after-first", "--fault-500-rate", "0.25",
			"--fault-429-rate", "0.5", "--fault-retry-after", "3", "--fault-die-after-tokens", "5",
			"--fault-slow", "2", "--fault-health-fail", "--api-key", "k", "--admin=false"},
			check: func(t *testing.T, c emulateConfig) {
				want := emulator.Faults{Hang: true, HangAfterFirst: true, Rate500: 0.25, Rate429: 0.5,
					RetryAfter: 3, DieAfterTokens: 5, Slow: 2, HealthFail: true}
				if c.server.Faults != want || c.server.APIKey != "k" || c.server.Admin {
					t.Errorf("%+v", c.server)
				}
			}},
		{name: "no faults by default, admin on", args: nil, check: func(t *testing.T, c emulateConfig) {
			if f := c.server.Faults; f != (emulator.Faults{RetryAfter: 1, Slow: 1}) || !c.server.Admin || c.server.APIKey != "" {
				t.Errorf("%+v", c.server)
			}
		}},
		{name: "fault rate above 1", args: []string{"--fault-500-rate", "1.5"}, wantErr: "rate_500"},
		{name: "fault rates sum above 1", args: []string{"--fault-500-rate", "0.5", "--fault-429-rate", "0.6"}, wantErr: "exceed 1"},
		{name: "zero kv blocks", args: []string{"--kv-blocks", "0"}, wantErr: "--kv-blocks must be positive"},
		{name: "negative seqs", args: []string{"--max-num-seqs", "-1"}, wantErr: "--max-num-seqs must be positive"},
		{name: "zero replicas", args: []string{"--replicas", "0"}, wantErr: "--replicas"},
		{name: "bad port", args: []string{"--port", "70000"}, wantErr: "not a TCP port"},
		{name: "ports run out", args: []string{"--port", "65535", "--replicas", "2"}, wantErr: "past port 65535"},
		{name: "zero time scale", args: []string{"--time-scale", "0"}, wantErr: "--time-scale"},
		{name: "bad log level", args: []string{"--log-level", "loud"}, wantErr: "log-level"},
		{name: "stray argument", args: []string{"extra"}, wantErr: "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseEmulateFlags(tt.args, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
	if _, err := parseEmulateFlags([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

// TestEmulateReplicas serves two replicas on free ports, checks that each
// answers with its own cache, and shuts them down.
func TestEmulateReplicas(t *testing.T) {
	cfg, err := parseEmulateFlags([]string{"--port", "0", "--replicas", "2", "--time-scale", "0.001", "--model", "m"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan []string, 1)
	done := make(chan error, 1)
	go func() {
		done <- emulate(ctx, cfg, slog.New(slog.DiscardHandler), func(urls []string) { ready <- urls })
	}()
	var urls []string
	select {
	case urls = <-ready:
	case err := <-done:
		t.Fatalf("emulate: %v", err)
	}
	if len(urls) != 2 || urls[0] == urls[1] {
		t.Fatalf("urls %q", urls)
	}
	body := `{"model":"m","prompt":"` + strings.Repeat("word ", 100) + `","max_tokens":2}`
	cached := func(url string) int {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
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
		}
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&r) != nil {
			t.Fatalf("%s: status %d", url, resp.StatusCode)
		}
		return r.Usage.Details.Cached
	}
	if cached(urls[0]) != 0 || cached(urls[0]) == 0 {
		t.Error("replica 0 did not cache a repeated prompt")
	}
	if got := cached(urls[1]); got != 0 {
		t.Errorf("replica 1 reports %d cached tokens for a prompt only replica 0 saw", got)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(shutdownGrace + 5*time.Second):
		t.Fatal("emulate did not shut down")
	}
}
