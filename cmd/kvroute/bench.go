package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/balancer"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/router/policies"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

// benchFlags is what the bench flags decide.
type benchFlags struct {
	cfg bench.Config
	out string
}

// parseBenchFlags parses the bench subcommand's flags and loads the workload.
// One flag a line, as --help lists them: its length is the flags'.
func parseBenchFlags(args []string, output io.Writer) (benchFlags, error) {
	fs := flag.NewFlagSet("kvroute bench", flag.ContinueOnError)
	fs.SetOutput(output)
	var (
		bf          benchFlags
		spec        string
		policyList  string
		profileName string
		opts        workload.Options
		kvBlocks    int
		backendURLs string
		faults      string
	)
	fs.StringVar(&spec, "workload", "chat", "workload: "+strings.Join(workload.Specs(), ", "))
	fs.IntVar(&bf.cfg.Backends, "backends", 8, "emulated backends")
	var splits string
	fs.IntVar(&bf.cfg.Prefill, "prefill", 0, "how many of --backends are emulated prefill servers (the rest decode; 0: an aggregated fleet); each policy then runs with each splitter of --pd-split, named POLICY@SPLITTER")
	fs.StringVar(&splits, "pd-split", policies.DefaultSplitter, "with --prefill: the splitters to compare, comma-separated, or all: "+strings.Join(policies.SplitterNames(), ", "))
	fs.StringVar(&backendURLs, "backend-url", "", "running servers to use instead of emulated ones, comma-separated URLs (e.g. llama-server from scripts/llama-fleet.sh); times are then real")
	fs.StringVar(&policyList, "policies", "kvroute,round-robin,least-request,session-hash", "policies to compare, comma-separated, or all: "+strings.Join(allPolicies(), ", "))
	fs.Float64Var(&opts.Rate, "rate", 0, "arrival rate, sessions (or requests) per second of model time (0: the workload's default or the trace's timestamps)")
	fs.IntVar(&bf.cfg.Users, "users", 0, "closed loop with this many users instead of open-loop arrivals")
	fs.DurationVar(&opts.Duration, "duration", 0, "span of arrivals (for traces: the part replayed, in trace time); 0: the workload's default or the whole trace")
	fs.Float64Var(&opts.Compress, "compress", 1, "traces: divide timestamps by this (4: four times the trace's rate)")
	fs.DurationVar(&opts.SpreadArrivals, "spread-arrivals", 0, "traces: spread the requests whose timestamps round to the same multiple of this over the interval after it, at random from --seed, in their order (3s for Mooncake's conversation trace, logged in 3-second ticks); in trace time, before --compress (0: the timestamps as they are)")
	fs.Float64Var(&bf.cfg.TimeScale, "time-scale", 0.2, "wall seconds per model second (0.2: five times faster than real time)")
	fs.Uint64Var(&opts.Seed, "seed", 1, "seed of the workload, the replies and the policies")
	fs.StringVar(&profileName, "profile", engine.DefaultProfile, "engine profile of the backends, or a mixed fleet of one model NAME:COUNT,... (e.g. h100-llama3-8b:2,a100-llama3-8b:2), whose counts give --backends: "+strings.Join(engine.ProfileNames(), ", "))
	fs.IntVar(&kvBlocks, "kv-blocks", 0, "KV blocks per backend (default: the profile's)")
	lf := addLoRAFlags(fs, "emulated backends, for workloads that name adapters (lora)")
	fs.IntVar(&bf.cfg.DataParallel, "data-parallel-size", 1, "data-parallel ranks of every emulated server (--backends counts servers), each a backend of the router's as serve --dp-ranks makes it")
	bf.cfg.Predictions = true // the report's "cached tokens predicted to the block"
	fs.BoolVar(&bf.cfg.KVEvents, "kv-events", false, "the emulators publish their KV events over ZMQ on 127.0.0.1 and kvroute follows them, as serve --kv-events: exact cached blocks instead of the index's guess")
	fs.Func("goodput", "ttft=DURATION,tpot=DURATION: report per policy the requests meeting this joint objective (kvroute:goodput serves it); a bare DURATION (e.g. 2s) instead searches each policy's highest rate with p99 TTFT under it, running the workload several times", func(v string) error {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			bf.cfg.Goodput = d
			return nil
		}
		slo, err := results.ParseSLO(v)
		bf.cfg.SLO = slo
		return err
	})
	objectiveFlag(fs, &bf.cfg.Objective)
	fs.StringVar(&faults, "faults", "", "fault schedule played against the emulated backends in every run, the same for each policy: a built-in ("+strings.Join(bench.FaultNames(), ", ")+") or a YAML/JSON file of {at, until, backend, fault} windows (docs/BENCHMARKS.md, Faults)")
	fs.StringVar(&bf.out, "out", "", "directory for results.json and report.html (default out/bench-WORKLOAD)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvroute bench [flags]\n\n"+
			"Plays a workload through each policy, each on a fresh emulated fleet with cold caches, and\n"+
			"reports TTFT, end-to-end and inter-token latency, throughput, cache hit rate against its\n"+
			"bounds, and load balance, side by side. Times are model time. With --backend-url the\n"+
			"same runs go to real servers (each run's prompts carry a tag of their own, so that no\n"+
			"run reuses another's cache), in real time.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return bf, err
	}
	if fs.NArg() > 0 {
		return bf, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	switch {
	case bf.cfg.Backends < 1:
		return bf, fmt.Errorf("--backends must be at least 1, got %d", bf.cfg.Backends)
	case !(bf.cfg.TimeScale > 0):
		return bf, fmt.Errorf("--time-scale must be positive, got %v", bf.cfg.TimeScale)
	case opts.Rate < 0 || opts.Compress <= 0 || opts.SpreadArrivals < 0 || bf.cfg.Users < 0 || opts.Duration < 0:
		return bf, errors.New("--rate, --users, --duration and --spread-arrivals must not be negative, --compress must be positive")
	case bf.cfg.Goodput > 0 && bf.cfg.Users > 0:
		return bf, errors.New("--goodput searches over arrival rates: it needs open-loop arrivals, not --users")
	}
	for _, u := range strings.Split(backendURLs, ",") {
		if u = strings.TrimSpace(u); u != "" {
			bf.cfg.BackendURLs = append(bf.cfg.BackendURLs, u)
		}
	}
	if len(bf.cfg.BackendURLs) > 0 {
		explicit := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
		for _, name := range []string{"backends", "time-scale", "profile", "kv-blocks", "kv-events"} {
			if explicit[name] {
				return bf, fmt.Errorf("--%s describes emulated backends; it cannot go with --backend-url", name)
			}
		}
		bf.cfg.Backends, bf.cfg.TimeScale = len(bf.cfg.BackendURLs), 1
	}
	if len(bf.cfg.BackendURLs) == 0 {
		p, servers, n, err := fleetProfiles(fs, profileName, bf.cfg.Backends, kvBlocks, 0) // mixflags.go
		if err != nil {
			return bf, err
		}
		bf.cfg.Profile, bf.cfg.Servers, bf.cfg.Backends = p, servers, n
	}
	if faults != "" {
		switch {
		case len(bf.cfg.BackendURLs) > 0:
			return bf, errors.New("--faults injects faults into emulated backends; it cannot go with --backend-url")
		case bf.cfg.Users > 0:
			return bf, errors.New("--faults places its windows along the arrivals: it needs open-loop arrivals, not --users")
		}
		sched, err := bench.LoadFaults(faults)
		if err != nil {
			return bf, err
		}
		if err := sched.Validate(bf.cfg.Backends); err != nil {
			return bf, err
		}
		bf.cfg.Faults = sched
	}
	var err error
	if bf.cfg.Policies, err = parsePolicies(policyList, allPolicies(), bench.IsBalancer); err != nil {
		return bf, err
	}
	switch {
	case bf.cfg.Prefill < 0 || bf.cfg.Prefill >= bf.cfg.Backends:
		return bf, fmt.Errorf("--prefill must be from 0 to --backends - 1, got %d", bf.cfg.Prefill)
	case bf.cfg.Prefill > 0 && (len(bf.cfg.BackendURLs) > 0 || slices.ContainsFunc(bf.cfg.Policies, bench.IsBalancer)):
		return bf, errors.New("--prefill needs emulated backends and kvroute's policies, not --backend-url or a balancer")
	case bf.cfg.Prefill > 0:
		if bf.cfg.Policies, err = withSplits(bf.cfg.Policies, splits); err != nil { // simdisagg.go
			return bf, err
		}
	}
	bf.cfg.Seed = opts.Seed
	var out string
	if bf.cfg.Workload, out, err = loadWorkload(spec, opts, "bench"); err != nil {
		return bf, err
	}
	if bf.out == "" {
		bf.out = out
	}
	if bf.cfg.DataParallel < 1 || bf.cfg.DataParallel > 1 && (bf.cfg.Faults != nil || backendURLs != "" || bf.cfg.KVEvents) {
		return bf, errors.New("--data-parallel-size must be at least 1, and above 1 goes without --faults, --backend-url and --kv-events")
	}
	if len(bf.cfg.Workload.Adapters()) > 0 {
		l, err := lf.lora(bf.cfg.Profile)
		if err != nil {
			return bf, err
		}
		bf.cfg.LoRA = &l
	}
	return bf, nil
}

func runBench(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "front" {
		return runBenchFront(args[1:], stdout, stderr) // benchfront.go
	}
	bf, err := parseBenchFlags(args, stderr)
	if code, ok := flagsDone("bench", err, stderr); !ok {
		return code
	}
	ctx, stop := signalContext()
	defer stop()
	cfg := bf.cfg
	cfg.Progress = stderr
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	if len(cfg.BackendURLs) > 0 {
		fmt.Fprintf(stdout, "kvroute bench: %s\n%d real servers (%s), real time; policies %s\n\n",
			cfg.Workload.Description, len(cfg.BackendURLs), strings.Join(cfg.BackendURLs, ", "), strings.Join(cfg.Policies, ", "))
	} else {
		fmt.Fprintf(stdout, "kvroute bench: %s\n%d × %s, time scale %g; policies %s\n",
			cfg.Workload.Description, cfg.Backends, cfg.Profile.Name, cfg.TimeScale, strings.Join(cfg.Policies, ", "))
		if cfg.Faults != nil {
			fmt.Fprintf(stdout, "faults %s:\n", cfg.Faults.Name)
			for _, w := range cfg.Faults.Windows {
				detail := ""
				if w.Fault == bench.FaultDie && w.Tokens > 0 {
					detail = fmt.Sprintf(" after %d tokens", w.Tokens)
				}
				fmt.Fprintf(stdout, "  %3.0f %% to %3.0f %% of the arrivals: backend %d %s%s\n", 100*w.At, 100*w.Until, w.Backend, w.Fault, detail)
			}
		}
		fmt.Fprintln(stdout)
	}
	started := time.Now()
	rep, err := bench.RunBench(ctx, cfg)
	if rep != nil && len(rep.Runs) > 0 {
		if werr := writeReport(stdout, rep, bf.out); werr != nil {
			fmt.Fprintf(stderr, "kvroute bench: %v\n", werr)
			return 1
		}
		sim.WriteKinds(stdout, sim.Config{Servers: cfg.Servers}, rep)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvroute bench: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "\n(%v of wall time)\n", time.Since(started).Round(time.Second))
	return 0
}

// writeReport prints the table and writes results.json and report.html.
func writeReport(w io.Writer, rep *results.Report, dir string) error {
	fmt.Fprintln(w)
	if err := rep.WriteTable(w); err != nil {
		return err
	}
	if err := rep.WriteJSON(dir); err != nil {
		return err
	}
	if err := report.WriteHTML(dir, rep); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nwrote %s and %s\n", filepath.Join(dir, "results.json"), filepath.Join(dir, "report.html"))
	return nil
}

// allPolicies lists every policy and every real balancer installed here.
func allPolicies() []string {
	names := policies.Names()
	for _, b := range balancer.Kinds() {
		if ok, _ := balancer.Available(b); ok {
			names = append(names, b)
		}
	}
	return names
}
