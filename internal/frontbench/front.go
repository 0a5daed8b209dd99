// Package frontbench measures what a front (a proxy or balancer in front of
// inference servers) adds to streamed responses, out of process: the
// backends in one process, each front in its own, pinned to its own CPU
// where the machine has two, and the load generator in a third, all on
// 127.0.0.1. It is `kvroute bench front`.
//
// The fronts are none (direct), nginx, HAProxy, the standard library's
// httputil.ReverseProxy, and kvroute serve with round-robin and with its own
// policy (and, given another kvroute binary, the same two from it, to
// compare builds in one run). For each number of concurrent streams it
// reports per front the client's time to first token and its added part
// over direct, the gap between a stream's chunks, the delay of each event
// from the backend's write to the client's read, and the front's CPU
// seconds (user and system, all its processes) per 10,000 events.
package frontbench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/internal/balancer"
)

// Config is a `kvroute bench front` run.
type Config struct {
	// Concurrency lists the numbers of concurrent streams, each measured
	// through every front.
	Concurrency []int
	// Events per stream; Gap between them, or 0 for max(20 ms,
	// streams/EventRate).
	Events    int
	Gap       time.Duration
	EventRate float64
	// Warmup and Duration of each measurement (LoadConfig).
	Warmup, Duration time.Duration
	// Rounds repeats every measurement, the fronts interleaved; the table
	// shows each figure's median over the rounds.
	Rounds int
	// Backends is the number of streaming servers behind the fronts.
	Backends int
	// Fronts to measure, of FrontNames; empty for all available.
	Fronts []string
	// BaseBinary, when set, is another kvroute binary (e.g. built from
	// main) whose serve is measured too, as "base/round-robin" and
	// "base/kvroute".
	BaseBinary string
	// FrontCPU is the CPU the fronts are bound to, LoadCPU the one of the
	// backends and the load generator; -1 leaves them unbound. Binding
	// needs two CPUs.
	FrontCPU, LoadCPU int
	Seed              uint64
	// Log receives progress lines.
	Log io.Writer
}

// The fronts, in the tables' order.
const (
	frontDirect  = "direct"
	frontNginx   = "nginx"
	frontHAProxy = "haproxy"
	frontStdlib  = "httputil"
	frontRR      = "kvroute/round-robin"
	frontKV      = "kvroute/kvroute"
	frontBaseRR  = "base/round-robin"
	frontBaseKV  = "base/kvroute"
)

// FrontNames lists the fronts Run knows.
func FrontNames() []string {
	return []string{frontDirect, frontNginx, frontHAProxy, frontStdlib, frontRR, frontKV, frontBaseRR, frontBaseKV}
}

const benchModel = "bench-model"

// front is one running front.
type front struct {
	name string
	url  string
	pid  int    // 0 for direct
	stop func() // nil for direct
	// gc is set for a Go front whose /metrics counts its garbage
	// collections (kvroute's): a cycle during a measurement charges the
	// requests that allocate meanwhile, and one cycle or none can decide a
	// p99 (docs/decisions/0003-gc-heap-floor-off.md).
	gc bool
}

// Result is one front at one concurrency: the medians over the rounds.
type Result struct {
	Front   string  `json:"front"`
	Streams int     `json:"streams"`
	GapMS   float64 `json:"gap_ms"`
	LoadResult
	// CPUPer10k is the front's CPU seconds per 10,000 events delivered; 0
	// for direct.
	CPUPer10k float64 `json:"cpu_s_per_10k_events"`
	// GCCycles counts the front's garbage collections while the load ran,
	// warm-up included (in a median row: over all rounds); -1 where the
	// front does not report them.
	GCCycles int `json:"gc_cycles"`
	// AllocsPerStream and AllocBytesPerStream are the front's heap
	// allocations (objects, bytes) while the load ran, warm-up and its own
	// health checks and scrapes included, per stream started, its events
	// included; 0 where the front does not report them.
	AllocsPerStream     float64 `json:"allocs_per_stream"`
	AllocBytesPerStream float64 `json:"alloc_bytes_per_stream"`
}

// Report is a whole run.
type Report struct {
	Machine  string   `json:"machine"`
	Pinning  string   `json:"pinning"`
	Backends int      `json:"backends"`
	Events   int      `json:"events_per_stream"`
	Results  []Result `json:"results"`
}

// Run measures every front at every concurrency and returns the report.
// self is this binary, which runs the backends, the standard library's
// proxy and the load generator as its roles (Role).
func Run(ctx context.Context, cfg Config, self string) (*Report, error) {
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}
	if limit, err := raiseFileLimit(); err != nil || limit < uint64(3*slices.Max(cfg.Concurrency)+256) {
		return nil, fmt.Errorf("open-file limit %d is too low for %d streams (ulimit -n): %v", limit, slices.Max(cfg.Concurrency), err)
	}
	pinning := fmt.Sprintf("fronts on CPU %d; backends and load generator on CPU %d (taskset, sched_setaffinity)", cfg.FrontCPU, cfg.LoadCPU)
	if runtime.NumCPU() < 2 || cfg.FrontCPU < 0 || cfg.LoadCPU < 0 {
		cfg.FrontCPU, cfg.LoadCPU = -1, -1
		pinning = "unpinned"
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	be, err := startChild(ctx, "backends", cfg.LoadCPU, self, "bench", "front", "--role", "backends", "--backends", strconv.Itoa(cfg.Backends))
	if err != nil {
		return nil, err
	}
	defer be.stop()
	line, err := be.line(10 * time.Second)
	if err != nil {
		return nil, err
	}
	backends := strings.Split(line, ",")
	logf("backends: %s", line)

	fronts, err := startFronts(ctx, cfg, self, backends, logf)
	defer func() {
		for _, f := range fronts {
			if f.stop != nil {
				f.stop()
			}
		}
	}()
	if err != nil {
		return nil, err
	}

	type key struct {
		front   string
		streams int
	}
	runs := map[key][]Result{}
	for round := range max(cfg.Rounds, 1) {
		for _, n := range cfg.Concurrency {
			gap := cfg.gapFor(n)
			for _, f := range fronts {
				r, err := measure(ctx, cfg, self, f, backends, n, gap, uint64(round))
				if err != nil {
					return nil, fmt.Errorf("%s, %d streams: %w", f.name, n, err)
				}
				logf("round %d, %d streams, %s: TTFT p50 %.2f p99 %.2f ms, gap p99 %.2f ms, delay p99 %.2f ms, %.3f CPU s/10k events, %d events, %d errors",
					round+1, n, f.name, r.TTFT.P50, r.TTFT.P99, r.ChunkGap.P99, r.Delay.P99, r.CPUPer10k, r.Events, r.Errors)
				if r.Errors > 0 {
					logf("  first error: %s", r.FirstError)
				}
				runs[key{f.name, n}] = append(runs[key{f.name, n}], *r)
			}
		}
	}
	rep := &Report{Machine: machine(), Pinning: pinning, Backends: cfg.Backends, Events: cfg.Events}
	for _, n := range cfg.Concurrency {
		for _, f := range fronts {
			rep.Results = append(rep.Results, medianResult(runs[key{f.name, n}]))
		}
	}
	return rep, nil
}

// gapFor is the gap between a stream's events at n streams: cfg.Gap, or
// 20 ms (50 tokens a second, a fast model's decode) unless n streams at
// that pace pass EventRate events a second in all, which the one CPU of
// the backends and the load generator must keep up with.
func (cfg Config) gapFor(n int) time.Duration {
	if cfg.Gap > 0 {
		return cfg.Gap
	}
	return max(20*time.Millisecond, time.Duration(float64(n)/cfg.EventRate*float64(time.Second)))
}

// measure runs the load generator once through f and reads f's CPU time
// around it.
func measure(ctx context.Context, cfg Config, self string, f front, backends []string, streams int, gap time.Duration, round uint64) (*Result, error) {
	targets := []string{f.url}
	if f.name == frontDirect {
		targets = backends
	}
	lc := LoadConfig{Targets: targets, Streams: streams, Events: cfg.Events, Gap: gap,
		Warmup: cfg.Warmup, Duration: cfg.Duration, Model: benchModel, Seed: cfg.Seed + round}
	spec, _ := json.Marshal(lc)
	var cpu0 float64
	if f.pid > 0 {
		var err error
		if cpu0, err = cpuSeconds(f.pid); err != nil {
			return nil, err
		}
	}
	rt0, rtErr := runtimeCounts(ctx, f)
	lg, err := startChild(ctx, "load generator", cfg.LoadCPU, self, "bench", "front", "--role", "load", "--load", string(spec))
	if err != nil {
		return nil, err
	}
	out, err := lg.rest()
	if err != nil {
		return nil, err
	}
	r := &Result{Front: f.name, Streams: streams, GapMS: float64(gap) / float64(time.Millisecond)}
	if err := json.Unmarshal(out, &r.LoadResult); err != nil {
		return nil, fmt.Errorf("load generator's result: %w", err)
	}
	if f.pid > 0 && r.Events > 0 {
		cpu1, err := cpuSeconds(f.pid)
		if err != nil {
			return nil, fmt.Errorf("%s exited: %w", f.name, err)
		}
		r.CPUPer10k = (cpu1 - cpu0) / float64(r.Events) * 1e4
	}
	r.GCCycles = -1
	if rt1, err := runtimeCounts(ctx, f); err == nil && rtErr == nil && f.gc {
		r.GCCycles = int(rt1.gc - rt0.gc)
		if r.Started > 0 {
			r.AllocsPerStream = (rt1.mallocs - rt0.mallocs) / float64(r.Started)
			r.AllocBytesPerStream = (rt1.bytes - rt0.bytes) / float64(r.Started)
		}
	}
	return r, nil
}

// goRuntime is what a Go front's /metrics tells of its runtime, as counts
// since it started: garbage collections, heap allocations and their bytes.
type goRuntime struct{ gc, mallocs, bytes float64 }

// runtimeCounts reads f's runtime counts from its /metrics; zero for a
// front that does not report them.
func runtimeCounts(ctx context.Context, f front) (goRuntime, error) {
	if !f.gc {
		return goRuntime{}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.url+"/metrics", nil)
	if err != nil {
		return goRuntime{}, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return goRuntime{}, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return goRuntime{}, fmt.Errorf("%s/metrics: status %d", f.url, res.StatusCode)
	}
	return goCounts(res.Body)
}

// goCounts reads the Go collector's go_gc_duration_seconds_count,
// go_memstats_mallocs_total and go_memstats_alloc_bytes_total from a
// Prometheus text exposition.
func goCounts(r io.Reader) (goRuntime, error) {
	var g goRuntime
	want := map[string]*float64{"go_gc_duration_seconds_count": &g.gc, "go_memstats_mallocs_total": &g.mallocs,
		"go_memstats_alloc_bytes_total": &g.bytes}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if p := want[name]; ok && p != nil {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return g, fmt.Errorf("%s: %w", name, err)
			}
			*p = n
			delete(want, name)
		}
	}
	if err := sc.Err(); err != nil {
		return g, err
	}
	for name := range want {
		return g, errors.New("no " + name + " in /metrics")
	}
	return g, nil
}

// startFronts starts the fronts cfg names (all by default), each on
// cfg.FrontCPU. A front whose program is not installed is skipped with a
// note when it was not asked for by name.
func startFronts(ctx context.Context, cfg Config, self string, backends []string, logf func(string, ...any)) ([]front, error) {
	names := cfg.Fronts
	asked := len(names) > 0
	if !asked {
		names = []string{frontDirect, frontNginx, frontHAProxy, frontStdlib, frontRR, frontKV}
		if cfg.BaseBinary != "" {
			names = append(names, frontBaseRR, frontBaseKV)
		}
	}
	var fronts []front
	for _, name := range names {
		f, err := startFront(ctx, cfg, self, name, backends)
		if errors.Is(err, balancer.ErrNotInstalled) && !asked {
			logf("skipping %s: %v", name, err)
			continue
		}
		if err != nil {
			return fronts, fmt.Errorf("start %s: %w", name, err)
		}
		logf("front %s: %s (pid %d)", name, f.url, f.pid)
		fronts = append(fronts, f)
	}
	return fronts, nil
}

func startFront(ctx context.Context, cfg Config, self, name string, backends []string) (front, error) {
	switch name {
	case frontDirect:
		return front{name: name}, nil
	case frontNginx, frontHAProxy:
		kind := map[string]string{frontNginx: "nginx-round-robin", frontHAProxy: "haproxy-roundrobin"}[name]
		b, err := balancer.Start(ctx, kind, backends, slog.New(slog.DiscardHandler))
		if err != nil {
			return front{}, err
		}
		if cfg.FrontCPU >= 0 {
			if err := pinTree(b.PID(), cfg.FrontCPU); err != nil {
				b.Close()
				return front{}, err
			}
		}
		return front{name: name, url: b.URL, pid: b.PID(), stop: func() { _ = b.Close() }}, nil
	case frontStdlib:
		c, err := startChild(ctx, name, cfg.FrontCPU, self, "bench", "front", "--role", "httputil", "--backend-urls", strings.Join(backends, ","))
		if err != nil {
			return front{}, err
		}
		u, err := c.line(10 * time.Second)
		if err != nil {
			c.stop()
			return front{}, err
		}
		return front{name: name, url: u, pid: c.cmd.Process.Pid, stop: c.stop}, nil
	case frontRR, frontKV, frontBaseRR, frontBaseKV:
		bin := self
		if name == frontBaseRR || name == frontBaseKV {
			if cfg.BaseBinary == "" {
				return front{}, errors.New("needs --base-binary")
			}
			bin = cfg.BaseBinary
		}
		policy := "round-robin"
		if name == frontKV || name == frontBaseKV {
			policy = "kvroute"
		}
		return startKVRoute(ctx, cfg, name, bin, policy, backends)
	}
	return front{}, fmt.Errorf("unknown front %q (want one of %s)", name, strings.Join(FrontNames(), ", "))
}

// startKVRoute runs bin's `serve` with policy in front of backends, without
// the caps that would queue the benchmark's streams (nginx and HAProxy have
// none either), and waits until it is ready. Its health checks get 10 s and
// it ejects no backend for slow first tokens: on a shared machine the
// backends' process is starved at times, and nginx and HAProxy fail over on
// errors only.
func startKVRoute(ctx context.Context, cfg Config, name, bin, policy string, backends []string) (front, error) {
	port, err := freePort()
	if err != nil {
		return front{}, err
	}
	addr := "127.0.0.1:" + port
	args := []string{"serve", "--listen", addr, "--policy", policy, "--log-level", "error",
		"--max-per-backend", "0", "--max-in-flight", "0", "--max-conns", "0", "--metrics-listen", "",
		"--probe-timeout", "10s", "--eject-slow", "0"}
	for _, b := range backends {
		args = append(args, "--backend", b)
	}
	c, err := startChild(ctx, name, cfg.FrontCPU, bin, args...)
	if err != nil {
		return front{}, err
	}
	url := "http://" + addr
	if err := waitReady(ctx, url+"/readyz", 20*time.Second); err != nil {
		c.stop()
		return front{}, fmt.Errorf("%w%s", err, c.stderr())
	}
	return front{name: name, url: url, pid: c.cmd.Process.Pid, stop: c.stop, gc: true}, nil
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), nil
}

// waitReady polls url until it answers 200.
func waitReady(ctx context.Context, url string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if res, err := client.Do(req); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w after %v", url, errNotReady, limit)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// medianResult is each figure's median over rounds.
func medianResult(rs []Result) Result {
	out := rs[0]
	med := func(get func(*Result) float64) float64 {
		v := make([]float64, len(rs))
		for i := range rs {
			v[i] = get(&rs[i])
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	out.TTFT.P50 = med(func(r *Result) float64 { return r.TTFT.P50 })
	out.TTFT.P99 = med(func(r *Result) float64 { return r.TTFT.P99 })
	out.ChunkGap.P50 = med(func(r *Result) float64 { return r.ChunkGap.P50 })
	out.ChunkGap.P99 = med(func(r *Result) float64 { return r.ChunkGap.P99 })
	out.Delay.P50 = med(func(r *Result) float64 { return r.Delay.P50 })
	out.Delay.P99 = med(func(r *Result) float64 { return r.Delay.P99 })
	out.CPUPer10k = med(func(r *Result) float64 { return r.CPUPer10k })
	out.AllocsPerStream = med(func(r *Result) float64 { return r.AllocsPerStream })
	out.AllocBytesPerStream = med(func(r *Result) float64 { return r.AllocBytesPerStream })
	out.Events, out.Started, out.Errors, out.Measured, out.GCCycles = 0, 0, 0, 0, 0
	for _, r := range rs {
		out.Events += r.Events
		out.Started += r.Started
		out.Errors += r.Errors
		out.Measured += r.Measured
		if r.GCCycles < 0 || out.GCCycles < 0 {
			out.GCCycles = -1 // not reported in some round
		} else {
			out.GCCycles += r.GCCycles
		}
	}
	return out
}

// machine describes the CPU the run had.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for l := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d CPUs, %s", model, runtime.NumCPU(), runtime.Version())
}

// WriteTable prints the report as one Markdown table per concurrency; the
// added TTFT is each front's minus direct's.
func WriteTable(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "machine: %s\npinning: %s\n%d backends, %d events per stream\n", rep.Machine, rep.Pinning, rep.Backends, rep.Events)
	var direct *Result
	streams := -1
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', tabwriter.Debug)
	for i := range rep.Results {
		r := &rep.Results[i]
		if r.Streams != streams {
			tw.Flush()
			streams, direct = r.Streams, nil
			if rep.Events == 1 {
				// Each stream's next request follows its one event at once:
				// the rate is what the fronts and the load generator keep up.
				fmt.Fprintf(w, "\n%d streams, one event each, requests back to back (CPU per 10k events is per 10k requests)\n\n", r.Streams)
			} else {
				fmt.Fprintf(w, "\n%d streams, one event every %.0f ms each (%.0f events/s in all)\n\n", r.Streams, r.GapMS, float64(r.Streams)/r.GapMS*1000)
			}
			fmt.Fprintln(tw, "front\tTTFT p50 ms\tTTFT p99 ms\tadded p50 ms\tadded p99 ms\tchunk gap p99 ms\tevent delay p99 ms\tCPU s / 10k events\tGC cycles (all rounds)\tallocs / stream\tKB alloc / stream\tstreams measured\terrors")
		}
		if r.Front == frontDirect {
			direct = r
		}
		added := func(get func(*Result) float64) string {
			if direct == nil || r.Front == frontDirect {
				return "–"
			}
			return fmt.Sprintf("%.2f", get(r)-get(direct))
		}
		cpu := "–"
		if r.Front != frontDirect {
			cpu = fmt.Sprintf("%.3f", r.CPUPer10k)
		}
		gc, allocs, kb := "–", "–", "–"
		if r.GCCycles >= 0 {
			gc = strconv.Itoa(r.GCCycles)
		}
		if r.AllocsPerStream > 0 {
			allocs, kb = fmt.Sprintf("%.0f", r.AllocsPerStream), fmt.Sprintf("%.1f", r.AllocBytesPerStream/1024)
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%s\t%s\t%.2f\t%.2f\t%s\t%s\t%s\t%s\t%d\t%d\n", r.Front, r.TTFT.P50, r.TTFT.P99,
			added(func(r *Result) float64 { return r.TTFT.P50 }), added(func(r *Result) float64 { return r.TTFT.P99 }),
			r.ChunkGap.P99, r.Delay.P99, cpu, gc, allocs, kb, r.Measured, r.Errors)
	}
	tw.Flush()
}
