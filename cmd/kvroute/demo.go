package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/router/policies"
	"github.com/kvroute/kvroute/internal/workload"
)

// parseDemoFlags parses the demo subcommand's flags.
func parseDemoFlags(args []string, output io.Writer) (bench.DemoConfig, error) {
	fs := flag.NewFlagSet("kvroute demo", flag.ContinueOnError)
	fs.SetOutput(output)
	var (
		cfg        bench.DemoConfig
		policyList string
		sessions   int
	)
	wl := workload.DemoChat()
	fs.IntVar(&cfg.Backends, "backends", 4, "emulated backends")
	fs.Float64Var(&cfg.TimeScale, "time-scale", 0.2, "wall seconds per model second (0.2: five times faster than real time)")
	fs.StringVar(&policyList, "policies", "round-robin,kvroute", "policies to compare, comma-separated: "+strings.Join(policies.Names(), ", "))
	fs.IntVar(&sessions, "sessions", wl.Sessions, "conversations in the workload")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the workload, the replies and the policies' tie-breaks")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvroute demo [flags]\n\n"+
			"Starts emulated backends and the router in this process, plays a multi-turn chat workload\n"+
			"(shared system prompts, light questions, a few long documents) once per policy on a fresh\n"+
			"fleet, and prints the results side by side. Times are model time.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	switch {
	case cfg.Backends < 1:
		return cfg, fmt.Errorf("--backends must be at least 1, got %d", cfg.Backends)
	case !(cfg.TimeScale > 0):
		return cfg, fmt.Errorf("--time-scale must be positive, got %v", cfg.TimeScale)
	case sessions < 1:
		return cfg, fmt.Errorf("--sessions must be at least 1, got %d", sessions)
	}
	for _, p := range strings.Split(policyList, ",") {
		p = strings.TrimSpace(p)
		if _, err := policies.New(p, nil, policies.Options{}); err != nil {
			return cfg, err
		}
		cfg.Policies = append(cfg.Policies, p)
	}
	wl.Sessions = sessions
	cfg.Workload = &wl
	return cfg, nil
}

func runDemo(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseDemoFlags(args, stderr)
	if code, ok := flagsDone("demo", err, stderr); !ok {
		return code
	}
	ctx, stop := signalContext()
	defer stop()
	cfg.Progress = stderr
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	wl := cfg.Workload
	fmt.Fprintf(stdout, "kvroute demo: %d emulated vLLM servers (Llama-3.1-8B on one H100 each), time scale %g;\n"+
		"%d conversations of %d turns under %d shared system prompts, 1 turn in %.0f carries a %d KB document.\n\n",
		cfg.Backends, cfg.TimeScale, wl.Sessions, wl.Turns, wl.SystemPrompts, 1/wl.HeavyFraction, wl.DocumentBytes/1000)
	rep, err := bench.RunDemo(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "kvroute demo: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout)
	if err := rep.WriteTable(stdout); err != nil {
		return 1
	}
	return 0
}
