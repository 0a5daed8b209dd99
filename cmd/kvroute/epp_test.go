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
