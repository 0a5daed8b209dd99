// Command kvroute is a cache- and load-aware router for OpenAI-compatible LLM
// servers, and the tools to measure it. Run `kvroute help` for the
// subcommands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// command is one subcommand: run gets the arguments after its name and
// returns the process exit code.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

// commands lists the subcommands in the order usage shows them.
var commands = []command{
	{"serve", "route OpenAI API requests to a fleet of inference servers (the router)", runServe},
	{"bench", "play a workload through every policy on an emulated fleet and report side by side", runBench},
	{"sim", "simulate a fleet and its router replicas in virtual time: policies at scale, capacity planning", runSim},
	{"demo", "compare round-robin and kvroute on an emulated fleet, in this process", runDemo},
	{"epp", "the endpoint picker of the Gateway API Inference Extension: an Envoy ext_proc server routing with kvroute", runEpp},
	{"emulate", "serve emulated vLLM servers (OpenAI API, vLLM metrics) driven by the engine model", runEmulate},
	{"data", "fetch the public traces and prompts the trace workloads read (docs/data.md), or list where they are", runData},
	{"version", "print the version, the commit and the Go toolchain (also --version)", runVersion},
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run dispatches to the subcommand named by args[0]. It returns 2 for a
// usage error.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return 0
	case "-version", "--version":
		return runVersion(args[1:], stdout, stderr)
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "kvroute: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: kvroute <command> [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'kvroute <command> -h' for a command's flags.\n")
}

// flagsDone turns a subcommand's flag-parsing error into its exit code: 0
// for -h, 2 (with the error printed) for a usage error; ok is false in both
// cases.
func flagsDone(name string, err error, stderr io.Writer) (code int, ok bool) {
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		return 0, false
	}
	fmt.Fprintf(stderr, "kvroute %s: %v\n", name, err)
	return 2, false
}

// signalContext is cancelled by SIGINT or SIGTERM; after the first signal a
// second one kills the process at once.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	return ctx, stop
}
