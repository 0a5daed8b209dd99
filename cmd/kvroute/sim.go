package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/hugepages"
	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/router/policies"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

// hugePageInterval is how often --huge-pages looks for the new parts of a
// growing heap: a pass reads /proc/self/maps (a few dozen lines) and asks
// for the new parts' huge pages, so the simulation's memory runs on 4 KiB
// pages for at most this long.
const hugePageInterval = 100 * time.Millisecond

// simFlags is what the sim flags decide.
type simFlags struct {
	cfg  sim.Config
	out  string
	find sim.FindConfig
	// cpuProfile, when set, is where a CPU profile of the run goes.
	cpuProfile string
	// hugePages asks for 2 MiB pages for the heap (internal/hugepages).
	hugePages bool
	// disagg is the prefill/decode flags (simdisagg.go).
	disagg simDisagg
}

// parseSimFlags parses the sim subcommand's flags and loads the workload.
// One flag a line, as --help lists them: its length is the flags'.
func parseSimFlags(args []string, output io.Writer) (simFlags, error) {
	fs := flag.NewFlagSet("kvroute sim", flag.ContinueOnError)
	fs.SetOutput(output)
	var (
		sf          simFlags
		spec        string
		policyList  string
		profileName string
		opts        workload.Options
		kvBlocks    int
		blockSize   int
		findBackend bool
	)
	fs.StringVar(&spec, "workload", "chat", "workload: "+strings.Join(workload.Specs(), ", "))
	fs.IntVar(&sf.cfg.Backends, "backends", 8, "simulated servers")
	fs.IntVar(&sf.cfg.Routers, "routers", 1, "router replicas behind a random L4 split, each with its own policy state")
	fs.StringVar(&policyList, "policies", "kvroute,round-robin,least-request,session-hash", "policies to compare, comma-separated, or all: "+strings.Join(policies.Names(), ", "))
	fs.Float64Var(&opts.Rate, "rate", 0, "arrival rate, sessions (or requests) per second (0: the workload's default or the trace's timestamps)")
	fs.IntVar(&sf.cfg.Users, "users", 0, "closed loop with this many users instead of open-loop arrivals")
	fs.DurationVar(&opts.Duration, "duration", 0, "span of arrivals (for traces: the part replayed, in trace time); 0: the workload's default or the whole trace")
	fs.Float64Var(&opts.Compress, "compress", 1, "traces: divide timestamps by this (4: four times the trace's rate)")
	fs.DurationVar(&opts.SpreadArrivals, "spread-arrivals", 0, "traces: spread the requests whose timestamps round to the same multiple of this over the interval after it, at random from --seed, in their order (3s for Mooncake's conversation trace, logged in 3-second ticks); in trace time, before --compress (0: the timestamps as they are)")
	fs.IntVar(&sf.cfg.Tile, "tile", 1, "traces: replay this many copies at once, each with its own sessions and prompts (a bigger fleet's traffic)")
	fs.Uint64Var(&opts.Seed, "seed", 1, "seed of the workload, the replies, the policies and the router split")
	fs.StringVar(&profileName, "profile", engine.DefaultProfile, "engine profile of the servers, or a mixed fleet NAME[=MODEL]:COUNT,... (e.g. h100-llama3-8b:4,a100-llama3-8b:4), whose counts give --backends: "+strings.Join(engine.ProfileNames(), ", "))
	fs.IntVar(&kvBlocks, "kv-blocks", 0, "KV blocks per server (default: the profile's)")
	fs.IntVar(&blockSize, "block-size", 0, "KV block of the servers in tokens, their KV capacity in tokens kept (default: the profile's; 512, the block of Mooncake's traces, simulates a large fleet many times faster)")
	fs.DurationVar(&sf.cfg.Scrape, "scrape-interval", time.Second, "how often each router replica reads the servers' metrics")
	fs.DurationVar(&sf.cfg.Gossip, "gossip", 0, "how often router replicas share their in-flight counts, as serve's --peer does every --peer-interval (0: never)")
	fs.DurationVar(&sf.cfg.GossipPush, "gossip-push", 0, "router replicas push their in-flight counts to each other whenever they change (a request routed, its first token, its end), reaching them after this one-way delay (e.g. 500us on a LAN; 0: never); with --kv-events kvroute then decides as one router but in a burst (two of its picks less than the delay apart: then as a replica in its lane of the servers), as serve's --peer-push-delay")
	fs.BoolVar(&sf.cfg.PushAsReplica, "push-as-replica", false, "with --gossip-push: kvroute decides as a replica behind polled counts does, instead of as one router outside bursts (with --kv-events)")
	fs.BoolVar(&sf.cfg.GossipEachRequest, "gossip-each-request", false, "router replicas also share their in-flight counts before every routing decision, as fresh as one router's (with --kv-events kvroute then decides as one router): the bound no poll reaches")
	fs.BoolVar(&sf.cfg.ReplicaUnaware, "replica-unaware", false, "do not tell kvroute how many replicas share the fleet (to measure what that saves)")
	fs.BoolVar(&sf.cfg.KVEvents, "kv-events", false, "servers publish their KV events (vLLM's BlockStored, BlockRemoved) and kvroute reads them: exact cached blocks instead of the index's guess")
	fs.DurationVar(&sf.cfg.KVEventDelay, "kv-event-delay", sim.DefaultKVEventDelay, "with --kv-events: how long after the step that made them the routers see a server's events")
	objectiveFlag(fs, &sf.cfg.Objective)
	fs.Func("goodput", "joint objective reported per policy, ttft=DURATION,tpot=DURATION (e.g. ttft=2s,tpot=50ms): the requests meeting both (p99 targets); kvroute:goodput serves it", func(v string) (err error) {
		sf.cfg.SLO, err = results.ParseSLO(v)
		return err
	})
	sf.disagg.register(fs, &sf.cfg) // simdisagg.go
	fs.BoolVar(&sf.cfg.FullScan, "full-scan", false, "kvroute scores every server on every pick instead of the few that can win (to measure what pruning changes)")
	fs.BoolVar(&sf.cfg.Text, "text", false, "traces: render prompts as text and tokenize them, as the live bench does (slower)")
	fs.IntVar(&sf.cfg.KeepRequests, "keep-requests", 100_000, "per-request results kept in results.json (an even sample beyond; -1: all)")
	fs.DurationVar(&sf.find.SLO, "slo-ttft-p99", 0, "p99 TTFT objective for --find-backends (e.g. 2s)")
	fs.DurationVar(&sf.find.TPOT, "slo-tpot-p99", 0, "with --find-backends --prefill N: a p99 time-per-output-token objective as well (e.g. 50ms; 0: none)")
	fs.BoolVar(&findBackend, "find-backends", false, "find, per policy, the smallest fleet whose p99 TTFT meets --slo-ttft-p99")
	fs.IntVar(&sf.find.Max, "max-backends", 4096, "--find-backends: the largest fleet tried")
	lf := addLoRAFlags(fs, "servers, for workloads that name adapters (lora)")
	dp := fs.Int("data-parallel-size", 1, "data-parallel ranks of every server (--backends counts servers): its engines, each its own cache and batch, routed to as backends gpuI/dpR as serve --dp-ranks makes them")
	fs.StringVar(&sf.out, "out", "", "directory for results.json and report.html (default out/sim-WORKLOAD)")
	fs.StringVar(&sf.cpuProfile, "cpuprofile", "", "write a CPU profile of the simulation to this file")
	fs.BoolVar(&sf.hugePages, "huge-pages", false, "Linux: ask for transparent huge pages (2 MiB) for the simulator's memory, where the system gives them only when asked: a large fleet's tables are read at random, and with 4 KiB pages nearly every read also misses the TLB; the kernel's work to assemble them costs system time, more than it saves with small blocks (results do not change)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvroute sim [flags]\n\n"+
			"Simulates a fleet of inference servers (the engine model of `kvroute emulate`) and router\n"+
			"replicas (the real policy code) in virtual time, replays a workload through each policy and\n"+
			"reports what `kvroute bench` reports. With --find-backends --slo-ttft-p99 D it finds each\n"+
			"policy's smallest fleet that meets the objective instead.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return sf, err
	}
	if fs.NArg() > 0 {
		return sf, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	switch {
	case sf.cfg.Backends < 1:
		return sf, fmt.Errorf("--backends must be at least 1, got %d", sf.cfg.Backends)
	case sf.cfg.Routers < 1:
		return sf, fmt.Errorf("--routers must be at least 1, got %d", sf.cfg.Routers)
	case sf.cfg.GossipPush < 0:
		return sf, fmt.Errorf("--gossip-push must not be negative, got %v", sf.cfg.GossipPush)
	case sf.cfg.Tile < 1:
		return sf, fmt.Errorf("--tile must be at least 1, got %d", sf.cfg.Tile)
	case opts.Rate < 0 || opts.Compress <= 0 || opts.SpreadArrivals < 0 || sf.cfg.Users < 0 || opts.Duration < 0:
		return sf, errors.New("--rate, --users, --duration and --spread-arrivals must not be negative, --compress must be positive")
	case findBackend && sf.find.SLO <= 0:
		return sf, errors.New("--find-backends needs --slo-ttft-p99")
	case !findBackend && sf.find.SLO > 0:
		return sf, errors.New("--slo-ttft-p99 is the objective of --find-backends: give both")
	case sf.find.Max < 1:
		return sf, fmt.Errorf("--max-backends must be at least 1, got %d", sf.find.Max)
	case blockSize < 0 || blockSize&(blockSize-1) != 0:
		// The policies' prefix indexes read the engine's block hashes in
		// blocks of 16 or 64 tokens: one block size must divide the other.
		return sf, fmt.Errorf("--block-size must be a power of two, got %d", blockSize)
	}
	p, servers, n, err := fleetProfiles(fs, profileName, sf.cfg.Backends, kvBlocks, blockSize) // mixflags.go
	if err != nil {
		return sf, err
	}
	sf.cfg.Profile, sf.cfg.Servers, sf.cfg.Backends = p, servers, n
	if findBackend && servers != nil {
		return sf, errors.New("--find-backends sizes a fleet of one profile, not a mixed --profile")
	}
	if sf.cfg.Policies, err = parsePolicies(policyList, policies.Names(), nil); err != nil {
		return sf, err
	}
	if err := sf.disagg.apply(&sf.cfg); err != nil { // simdisagg.go
		return sf, err
	}
	sf.cfg.Seed = opts.Seed
	var out string
	if sf.cfg.Workload, out, err = loadWorkload(spec, opts, "sim"); err != nil {
		return sf, err
	}
	if err := assignModels(&sf.cfg.Workload, servers, opts.Seed); err != nil {
		return sf, err
	}
	if sf.out == "" {
		sf.out = out
	}
	if *dp < 1 {
		return sf, fmt.Errorf("--data-parallel-size must be at least 1, got %d", *dp)
	}
	sf.cfg.Backends *= *dp
	sf.cfg.DataParallel = *dp
	if len(sf.cfg.Workload.Adapters()) > 0 {
		l, err := lf.lora(sf.cfg.Profile)
		if err != nil {
			return sf, err
		}
		sf.cfg.LoRA = &l
	}
	return sf, nil
}

func runSim(args []string, stdout, stderr io.Writer) int {
	sf, err := parseSimFlags(args, stderr)
	if code, ok := flagsDone("sim", err, stderr); !ok {
		return code
	}
	ctx, stop := signalContext()
	defer stop()
	if sf.hugePages {
		_, stopAdvice := hugepages.Keep(hugePageInterval)
		defer stopAdvice()
	}
	if sf.cpuProfile != "" {
		f, err := os.Create(sf.cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "kvroute sim: %v\n", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "kvroute sim: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	cfg := sf.cfg
	cfg.Progress = stderr
	started := time.Now()
	if sf.find.SLO > 0 && cfg.Prefill > 0 {
		return findPD(ctx, stdout, stderr, cfg, sf.find, started) // simdisagg.go
	}
	if sf.find.SLO > 0 {
		fmt.Fprintf(stdout, "kvroute sim --find-backends: %s\n%s servers, %d router replica(s); p99 TTFT objective %v; policies %s\n\n",
			tiledDescription(cfg), cfg.Profile.Name, cfg.Routers, sf.find.SLO, strings.Join(cfg.Policies, ", "))
		cfg.Progress = nil
		res, err := sim.FindBackends(ctx, cfg, sf.find, func(policy string, n int, p99 time.Duration, met bool) {
			mark := "✗"
			if met {
				mark = "✓"
			}
			fmt.Fprintf(stderr, "  %-20s %5d servers: p99 TTFT %8.0f ms %s\n", policy, n, float64(p99)/float64(time.Millisecond), mark)
		})
		if err != nil {
			fmt.Fprintf(stderr, "kvroute sim: %v\n", err)
			return 1
		}
		sim.WriteFindTable(stdout, res, sf.find.SLO)
		if err := writeFindResults(stdout, cfg, res, sf.find.SLO, sf.out); err != nil { // simfind.go
			fmt.Fprintf(stderr, "kvroute sim: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "\n(%v of wall time)\n", time.Since(started).Round(time.Millisecond))
		return 0
	}
	fmt.Fprintf(stdout, "kvroute sim: %s\n%d × %s, %d router replica(s), virtual time; policies %s\n\n",
		tiledDescription(cfg), cfg.Backends, cfg.Profile.Name, cfg.Routers, strings.Join(cfg.Policies, ", "))
	rep, stats, err := sim.RunStats(ctx, cfg)
	if rep != nil && len(rep.Runs) > 0 {
		if werr := writeReport(stdout, rep, sf.out); werr != nil {
			fmt.Fprintf(stderr, "kvroute sim: %v\n", werr)
			return 1
		}
		sim.WriteKinds(stdout, cfg, rep)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvroute sim: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout)
	for i, st := range stats {
		fmt.Fprintf(stdout, "%-20s %v simulated in %v of wall time (%d events, %d engine steps)\n",
			rep.Runs[i].Policy, st.Virtual.Round(time.Second), st.Wall.Round(time.Millisecond), st.Events, st.Steps)
	}
	fmt.Fprintf(stdout, "(%v of wall time in all; peak resident memory %s)\n",
		time.Since(started).Round(time.Millisecond), peakRSS())
	return 0
}

// tiledDescription describes the workload as the simulation plays it: with
// --tile, its copies and their requests in all.
func tiledDescription(cfg sim.Config) string {
	if cfg.Tile <= 1 {
		return cfg.Workload.Description
	}
	return fmt.Sprintf("%s; tiled %d×: %d requests in all", cfg.Workload.Description, cfg.Tile, cfg.Tile*cfg.Workload.Requests())
}

// peakRSS reports the process's peak resident memory (Linux's VmHWM), or
// the memory the Go runtime holds from the OS where that is not available.
func peakRSS() string {
	if data, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return fmt.Sprintf("%d MiB held from the OS", ms.Sys>>20)
}
