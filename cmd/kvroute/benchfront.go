package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/frontbench"
)

// parseBenchFrontFlags parses `kvroute bench front`'s flags.
func parseBenchFrontFlags(args []string, output io.Writer) (frontbench.Config, string, frontbench.RoleArgs, string, error) {
	fs := flag.NewFlagSet("kvroute bench front", flag.ContinueOnError)
	fs.SetOutput(output)
	var (
		cfg         frontbench.Config
		conc, names string
		role, out   string
		ra          frontbench.RoleArgs
	)
	fs.StringVar(&conc, "streams", "100,500,2000", "concurrent streams, comma-separated: each is measured through every front")
	fs.StringVar(&names, "fronts", "", "fronts, comma-separated (default: all installed but base/*): "+strings.Join(frontbench.FrontNames(), ", "))
	fs.IntVar(&cfg.Events, "events", 50, "content events per stream (1: a run of nearly nothing but the requests' own work, no chunk gaps)")
	fs.DurationVar(&cfg.Gap, "gap", 0, "time between a stream's events (0: 20ms, longer where the streams would pass --event-rate)")
	fs.Float64Var(&cfg.EventRate, "event-rate", 10000, "most events a second in all when --gap is 0: the one CPU of the backends and the load generator must keep up")
	fs.DurationVar(&cfg.Warmup, "warmup", 2*time.Second, "streams start over this time and are not measured")
	fs.DurationVar(&cfg.Duration, "duration", 5*time.Second, "then measured streams start for this long")
	fs.IntVar(&cfg.Rounds, "rounds", 1, "measure everything this many times, fronts interleaved; the table shows medians")
	fs.IntVar(&cfg.Backends, "backends", 4, "streaming servers behind the fronts")
	fs.StringVar(&cfg.BaseBinary, "base-binary", "", "another kvroute binary (e.g. built from main) whose serve is measured too, as base/round-robin and base/kvroute")
	fs.IntVar(&cfg.FrontCPU, "front-cpu", 1, "CPU the fronts are bound to (-1: unbound)")
	fs.IntVar(&cfg.LoadCPU, "load-cpu", 0, "CPU the backends and the load generator are bound to (-1: unbound)")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the prompts and the stream starts")
	fs.StringVar(&out, "out", "", "also write the results as JSON to this file")
	fs.StringVar(&role, "role", "", "internal: run as one of the benchmark's processes ("+
		strings.Join([]string{frontbench.RoleBackends, frontbench.RoleStdlib, frontbench.RoleLoad}, ", ")+")")
	fs.StringVar(&ra.BackendURLs, "backend-urls", "", "internal: the httputil role's backends")
	fs.StringVar(&ra.Load, "load", "", "internal: the load role's configuration (JSON)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvroute bench front [flags]\n\n"+
			"Measures what a front adds to streamed responses, out of process: fast streaming backends\n"+
			"in one process, each front in its own (bound to --front-cpu), a load generator in a third,\n"+
			"all on 127.0.0.1. Fronts: direct (none), nginx, HAProxy, the standard library's\n"+
			"httputil.ReverseProxy, kvroute serve with round-robin and with kvroute. Reports per front the\n"+
			"TTFT and its part added over direct, the chunk gap, each event's delay and the front's CPU\n"+
			"seconds per 10,000 events; for kvroute's fronts also their garbage collections and heap\n"+
			"allocations per stream (from their /metrics).\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, "", ra, "", err
	}
	if fs.NArg() > 0 {
		return cfg, "", ra, "", fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	ra.Backends = cfg.Backends
	for s := range strings.SplitSeq(conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return cfg, "", ra, "", fmt.Errorf("--streams: %q is not a positive number", s)
		}
		cfg.Concurrency = append(cfg.Concurrency, n)
	}
	for s := range strings.SplitSeq(names, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.Fronts = append(cfg.Fronts, s)
		}
	}
	switch {
	case cfg.Events < 1 || cfg.Backends < 1 || cfg.Rounds < 1:
		return cfg, "", ra, "", errors.New("--events, --backends and --rounds must be at least 1")
	case cfg.Gap < 0 || cfg.EventRate <= 0 || cfg.Warmup < 0 || cfg.Duration <= 0:
		return cfg, "", ra, "", errors.New("--gap and --warmup must not be negative, --event-rate and --duration must be positive")
	}
	return cfg, role, ra, out, nil
}

func runBenchFront(args []string, stdout, stderr io.Writer) int {
	cfg, role, ra, out, err := parseBenchFrontFlags(args, stderr)
	if code, ok := flagsDone("bench front", err, stderr); !ok {
		return code
	}
	ctx, stop := signalContext()
	defer stop()
	if role != "" {
		if err := frontbench.RunRole(ctx, role, ra, stdout); err != nil {
			fmt.Fprintf(stderr, "kvroute bench front --role %s: %v\n", role, err)
			return 1
		}
		return 0
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "kvroute bench front: %v\n", err)
		return 1
	}
	cfg.Log = stderr
	started := time.Now()
	rep, err := frontbench.Run(ctx, cfg, self)
	if err != nil {
		fmt.Fprintf(stderr, "kvroute bench front: %v\n", err)
		return 1
	}
	frontbench.WriteTable(stdout, rep)
	if out != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintf(stderr, "kvroute bench front: %v\n", err)
			return 1
		}
	}
	fmt.Fprintf(stdout, "\n(%v of wall time)\n", time.Since(started).Round(time.Second))
	return 0
}
