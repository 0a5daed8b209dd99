package main

import (
	"io"
	"strings"
	"testing"
)

// A mixed --profile sets the fleet's size; --backends given too must
// agree; a list needs every count; models are given to the sessions in
// proportion to their servers.
func TestSimMixedProfile(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		backends int
		models   int
		wantErr  string
	}{
		{"one profile", []string{"--profile", "a100-llama3-8b", "--backends", "3"}, 3, 1, ""},
		{"two generations", []string{"--profile", "h100-llama3-8b:2,a100-llama3-8b:3"}, 5, 1, ""},
		{"agreeing --backends", []string{"--profile", "h100-llama3-8b:2,a100-llama3-8b:3", "--backends", "5"}, 5, 1, ""},
		{"three models", []string{"--profile", "h100-llama3-8b:4,4xh100-llama3-70b:2,h100-llama3-8b=code:2"}, 8, 3, ""},
		{"disagreeing --backends", []string{"--profile", "h100-llama3-8b:2,a100-llama3-8b:3", "--backends", "8"}, 0, 0, "names 5 servers, --backends 8"},
		{"a count missing", []string{"--profile", "h100-llama3-8b:2,a100-llama3-8b"}, 0, 0, "has no count"},
		{"find-backends", []string{"--profile", "h100-llama3-8b:2,a100-llama3-8b:2", "--find-backends", "--slo-ttft-p99", "2s"}, 0, 0, "--find-backends sizes a fleet of one profile"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sf, err := parseSimFlags(append(tt.args, "--workload", "small-chat"), io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sf.cfg.Backends != tt.backends {
				t.Errorf("%d backends, want %d", sf.cfg.Backends, tt.backends)
			}
			models := map[string]bool{}
			for _, s := range sf.cfg.Workload.Sessions {
				models[s.Model] = true
			}
			if tt.models == 1 && (len(models) != 1 || !models[""]) || tt.models > 1 && len(models) != tt.models {
				t.Errorf("sessions name models %v, want %d", models, tt.models)
			}
		})
	}
}
