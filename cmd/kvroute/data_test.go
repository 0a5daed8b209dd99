package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/shareddata"
)

// On a fresh clone with no ../shared beside it and nothing fetched, every
// command that reads a data set fails with a message naming the step that
// fetches it.
func TestMissingDataNamesTheFetchStep(t *testing.T) {
	empty := t.TempDir()
	t.Chdir(t.TempDir()) // no go.mod above: no ../shared/data
	t.Setenv(shareddata.EnvDir, empty)
	tests := []struct {
		name string
		args []string
	}{
		{"sim mooncake", []string{"sim", "--workload", "mooncake", "--duration", "1m"}},
		{"sim azure", []string{"sim", "--workload", "azure"}},
		{"bench multiturn", []string{"bench", "--workload", "multiturn"}},
		{"sim trace path that is not there", []string{"sim", "--workload", "mooncake:../shared/data/mooncake/conversation_trace.jsonl",
			"--find-backends", "--slo-ttft-p99", "8s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tt.args, &stdout, &stderr); code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if msg := stderr.String(); !strings.Contains(msg, "`kvroute data fetch`") {
				t.Errorf("stderr does not name `kvroute data fetch`: %q", msg)
			}
		})
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"data", "list"}, &stdout, &stderr); code != 0 ||
		strings.Count(stdout.String(), "missing: run `kvroute data fetch`") != len(shareddata.Files) {
		t.Errorf("data list: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}

// A file fetched into the data directory is found by the workloads.
func TestFetchedDataIsFound(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(t.TempDir())
	t.Setenv(shareddata.EnvDir, dir)
	p := filepath.Join(dir, "mooncake", "conversation_trace.jsonl")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	trace := `{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [0, 1]}` + "\n" +
		`{"timestamp": 500, "input_length": 700, "output_length": 12, "hash_ids": [0, 2]}` + "\n"
	if err := os.WriteFile(p, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	sf, err := parseSimFlags([]string{"--workload", "mooncake"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if n := sf.cfg.Workload.Requests(); n != 2 {
		t.Errorf("%d requests, want the file's 2", n)
	}
}
