package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
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
