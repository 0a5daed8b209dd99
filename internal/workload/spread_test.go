package workload

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// quantizedTrace writes a Mooncake-format trace logged in whole seconds,
// as the conversation trace is: 12 requests at 0 ms, 5 at 999 ms (a
// millisecond below the mark), 1 at 1001 ms, 7 at 4000 ms.
func quantizedTrace(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, g := range []struct{ ms, n int }{{0, 12}, {999, 5}, {1001, 1}, {4000, 7}} {
		for range g.n {
			fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}`+"\n", g.ms)
		}
	}
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Spreading keeps every request and the trace's order, moves each within
// the second its timestamp rounds to (after compression), leaves no two at
// one instant, and is the same for the same seed and different for
// another.
func TestSpreadArrivals(t *testing.T) {
	spec := "mooncake:" + quantizedTrace(t)
	load := func(seed uint64, spread time.Duration) Workload {
		w, err := Load(spec, Options{Seed: seed, Compress: 2, SpreadArrivals: spread})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	plain, a, b, other := load(1, 0), load(1, time.Second), load(1, time.Second), load(2, time.Second)
	if len(a.Sessions) != len(plain.Sessions) || len(a.Sessions) != 25 {
		t.Fatalf("%d requests spread, %d not; want 25", len(a.Sessions), len(plain.Sessions))
	}
	marks := []time.Duration{}
	for _, g := range []struct {
		mark time.Duration
		n    int
	}{{0, 12}, {time.Second, 6}, {4 * time.Second, 7}} {
		for range g.n {
			marks = append(marks, g.mark)
		}
	}
	seen := map[time.Duration]bool{}
	differ := false
	for i, s := range a.Sessions {
		if want := fmt.Sprintf("mc-%06d", i); s.ID != want {
			t.Fatalf("session %d is %s: the trace's order changed", i, s.ID)
		}
		lo, hi := marks[i]/2, (marks[i]+time.Second)/2 // compressed 2×
		if s.Start < lo || s.Start >= hi {
			t.Errorf("%s starts at %v, want within [%v, %v)", s.ID, s.Start, lo, hi)
		}
		if seen[s.Start] {
			t.Errorf("%s starts at %v with another request", s.ID, s.Start)
		}
		seen[s.Start] = true
		if s.Start != b.Sessions[i].Start {
			t.Errorf("%s: %v, then %v with the same seed", s.ID, s.Start, b.Sessions[i].Start)
		}
		differ = differ || s.Start != other.Sessions[i].Start
	}
	if !differ {
		t.Error("seeds 1 and 2 spread the requests alike")
	}
	if a.Spread == nil || a.Spread.Quantum != 500*time.Millisecond {
		t.Fatalf("spread %+v, want a 500ms quantum after compression", a.Spread)
	}
	// Another copy (the simulator's tiles) is spread over the same
	// seconds on draws of its own, in order.
	var scratch SpreadScratch
	prev := time.Duration(-1)
	same := 0
	for i, s := range a.Sessions {
		c := a.Spread.Copy(i, 1, &scratch)
		if lo, hi := marks[i]/2, (marks[i]+time.Second)/2; c < lo || c >= hi || c < prev {
			t.Errorf("copy 1 of %s starts at %v (after %v), want within [%v, %v) in order", s.ID, c, prev, lo, hi)
		}
		if c == s.Start {
			same++
		}
		prev = c
		if got := a.Spread.Copy(i, 0, &scratch); got != s.Start {
			t.Errorf("copy 0 of %s at %v, its start %v", s.ID, got, s.Start)
		}
	}
	if same > 0 {
		t.Errorf("%d requests start at the same instant in copies 0 and 1", same)
	}
}

func TestSpreadArrivalsNeedsTimestamps(t *testing.T) {
	for _, c := range []struct {
		spec string
		opts Options
	}{
		{"chat", Options{SpreadArrivals: time.Second}},
		{"mooncake:" + quantizedTrace(t), Options{SpreadArrivals: time.Second, Rate: 5}},
		{"mooncake:" + quantizedTrace(t), Options{SpreadArrivals: -time.Second}},
	} {
		if _, err := Load(c.spec, c.opts); err == nil {
			t.Errorf("%s with %+v: no error", c.spec, c.opts)
		}
	}
}
