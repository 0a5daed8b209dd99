package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// writeLongTrace writes a Mooncake-format trace of n requests a second
// apart, each with a prompt of tokens distinct tokens, and returns its path.
func writeLongTrace(t *testing.T, n, tokens int) string {
	var b strings.Builder
	id := 0
	for i := range n {
		var ids []string
		for range (tokens + 511) / 512 {
			ids = append(ids, fmt.Sprint(id))
			id++
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": 8, "hash_ids": [%s]}`+"\n",
			1000*i, tokens, strings.Join(ids, ", "))
	}
	p := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// An objective below the prefill of the longest prompts is explained, and
// the objective offered instead is met when asked for.
func TestFindBackendsExplainsAndOffersAReachableObjective(t *testing.T) {
	trace := writeLongTrace(t, 40, 100_000)
	find := func(slo string) (string, findFile) {
		t.Helper()
		out := t.TempDir()
		var stdout, stderr bytes.Buffer
		args := []string{"sim", "--workload", "mooncake:" + trace, "--find-backends", "--slo-ttft-p99", slo,
			"--policies", "round-robin", "--block-size", "512", "--max-backends", "64", "--out", out}
		if code := run(args, &stdout, &stderr); code != 0 {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		data, err := os.ReadFile(filepath.Join(out, "find.json"))
		if err != nil {
			t.Fatal(err)
		}
		var f findFile
		if err := json.Unmarshal(data, &f); err != nil {
			t.Fatal(err)
		}
		return stdout.String(), f
	}
	text, f := find("1s")
	if p := f.Policies[0]; p.Backends != 0 || !p.Floor || len(p.Trials) < 3 {
		t.Fatalf("a 1 s objective for 100k-token prompts: %+v, want none found, at the floor", p)
	}
	m := regexp.MustCompile(`p99 100000 tokens\), which more servers do not shorten\.\n  Reachable: p99 TTFT ≤ (\S+) `).FindStringSubmatch(text)
	if !strings.Contains(text, "no fleet meets p99 TTFT ≤ 1s") || m == nil {
		t.Fatalf("output does not explain the floor and offer an objective:\n%s", text)
	}
	_, f = find(m[1])
	if p := f.Policies[0]; p.Backends == 0 {
		t.Errorf("the objective offered, %s, is not met: %+v", m[1], p)
	}
}

// A tiled simulation's header counts the requests it plays, every copy's.
func TestSimHeaderCountsTiledRequests(t *testing.T) {
	trace := writeLongTrace(t, 10, 1000)
	var stdout, stderr bytes.Buffer
	args := []string{"sim", "--workload", "mooncake:" + trace, "--tile", "3", "--backends", "2",
		"--policies", "round-robin", "--out", t.TempDir()}
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	header, _, _ := strings.Cut(stdout.String(), "\n")
	if !strings.Contains(header, "10 requests") || !strings.HasSuffix(header, "tiled 3×: 30 requests in all") {
		t.Errorf("header %q, want the trace's 10 requests tiled 3× to 30", header)
	}
}
