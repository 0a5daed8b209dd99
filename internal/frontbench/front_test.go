package frontbench

import (
	"context"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

// TestLoadThroughStdlibFront plays a short load directly and through the
// standard library's proxy: every stream gets all its events, and every
// stream started after the warm-up is measured.
func TestLoadThroughStdlibFront(t *testing.T) {
	bs, err := StartBackends(2, benchModel)
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	h, err := NewStdlibFront(bs.URLs)
	if err != nil {
		t.Fatal(err)
	}
	px := httptest.NewServer(h)
	defer px.Close()
	for _, targets := range [][]string{bs.URLs, {px.URL}} {
		res, err := RunLoad(context.Background(), LoadConfig{Targets: targets, Streams: 4, Events: 5,
			Gap: time.Millisecond, Duration: 50 * time.Millisecond, Model: benchModel, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if res.Errors != 0 || res.Measured == 0 || res.Events < int64(5*res.Measured) {
			t.Fatalf("%v: %+v", targets, res)
		}
		if res.TTFT.N != res.Measured || res.ChunkGap.N != 4*res.Measured || res.Delay.N != 5*res.Measured {
			t.Errorf("%v: samples %+v %+v %+v for %d streams", targets, res.TTFT, res.ChunkGap, res.Delay, res.Measured)
		}
	}
}

// TestCPUSecondsOfThisProcess spins until this process's CPU time, read
// from /proc, moves: it must within seconds.
func TestCPUSecondsOfThisProcess(t *testing.T) {
	before, err := cpuSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		after, err := cpuSeconds(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			return
		}
	}
	t.Errorf("CPU time stayed at %v s over 5 s of spinning", before)
}

func TestGapFor(t *testing.T) {
	cfg := Config{EventRate: 25000}
	for _, tc := range []struct {
		streams int
		want    time.Duration
	}{{100, 20 * time.Millisecond}, {500, 20 * time.Millisecond}, {2000, 80 * time.Millisecond}} {
		if got := cfg.gapFor(tc.streams); got != tc.want {
			t.Errorf("gapFor(%d) = %v, want %v", tc.streams, got, tc.want)
		}
	}
}

// goCounts reads the Go runtime's collections and allocations from a
// front's /metrics; a page without them is an error.
func TestGoCounts(t *testing.T) {
	page := "# HELP go_gc_duration_seconds A summary.\n# TYPE go_gc_duration_seconds summary\n" +
		"go_gc_duration_seconds{quantile=\"0\"} 5.1e-05\ngo_gc_duration_seconds_sum 0.0006\ngo_gc_duration_seconds_count 17\ngo_goroutines 24\n" +
		"go_memstats_alloc_bytes 1.2e+06\ngo_memstats_alloc_bytes_total 3.5e+08\ngo_memstats_mallocs_total 4.2e+06\n"
	want := goRuntime{gc: 17, mallocs: 4.2e6, bytes: 3.5e8}
	if g, err := goCounts(strings.NewReader(page)); err != nil || g != want {
		t.Errorf("goCounts = %+v, %v; want %+v", g, err, want)
	}
	if g, err := goCounts(strings.NewReader("go_goroutines 24\ngo_gc_duration_seconds_count 17\n")); err == nil {
		t.Errorf("goCounts of a page without the allocations = %+v, want an error", g)
	}
}
