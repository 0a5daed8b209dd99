package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/kvroute/kvroute/internal/epp"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/gctune"
	"github.com/kvroute/kvroute/internal/router/policies"
)

// eppConfig is what the epp flags decide.
type eppConfig struct {
	server    epp.Config
	discovery discoveryConfig // discoveryflags.go
	grace     time.Duration
	logLevel  slog.Level
	gcFloor   int // MiB

	disagg disaggConfig // disaggflags.go: the splitter
}

// eppGrace is how long requests in flight get on SIGTERM before their
// streams are cut: the ext_proc stream lives as long as the response.
const eppGrace = 45 * time.Second

// parseEppFlags parses the epp subcommand's flags. Endpoints come from
// --endpoint ip:port, --backend URL, a --config file, or the discovery
// flags serve has (--pool-name, --k8s-service, --dns), or any of them.
// One flag a line, as --help lists them: its length is the flags'.
func parseEppFlags(args []string, output io.Writer) (eppConfig, error) {
	fs := flag.NewFlagSet("kvroute epp", flag.ContinueOnError)
	fs.SetOutput(output)
	var (
		cfg        eppConfig
		endpoints  stringList
		specs      stringList
		configPath string
		headerList bool
	)
	sc, po := &cfg.server, &cfg.server.Picker
	fs.Var(&endpoints, "endpoint", "an endpoint as ip:port, served over http (repeatable)")
	fs.Var(&specs, "backend", "an endpoint as [name=]URL, as for serve (repeatable); Envoy is told its host:port")
	fs.StringVar(&configPath, "config", "", "YAML file: backends: [{name, url, api_key_env}] (re-read when it changes), and any flag below as a key")
	cfg.discovery.register(fs) // discoveryflags.go: --pool-name, --k8s-service, --dns, ...
	fs.StringVar(&sc.GRPCListen, "grpc-listen", epp.DefaultGRPCListen, "address of the ext_proc and gRPC health services")
	fs.StringVar(&sc.MetricsListen, "metrics-listen", "", "address of /metrics (empty: not served)")
	core := coreFlags{&sc.Policy, &sc.Fleet, &sc.Router, &po.SessionHeader}
	core.register(fs) // coreflags.go: --policy, --scrape-interval, --load-factor, ...
	fs.IntVar(&po.Fallbacks, "fallbacks", 2, "endpoints after the chosen one in the envoy.lb destination list, next-best first, for Envoy's retries")
	fs.BoolVar(&po.OriginalDstHeader, "original-dst-header", false, "put only the chosen endpoint in the x-gateway-destination-endpoint header, for an Envoy ORIGINAL_DST cluster, which reads one address; the envoy.lb metadata keeps the list, which the protocol forbids when --fallbacks > 0")
	fs.BoolVar(&headerList, "header-list", true, "deprecated: the header carries the whole destination list, as the metadata does (false: --original-dst-header)")
	fs.IntVar(&po.MaxPerEndpoint, "max-per-endpoint", epp.DefaultMaxPerEndpoint, "most generation requests in flight on one endpoint; past it requests queue, then get 429 (negative: no cap)")
	fs.IntVar(&po.Admission.MaxQueue, "max-queue", 1024, "most requests waiting for room (negative: none, refuse at once)")
	fs.DurationVar(&po.Admission.QueueTimeout, "queue-timeout", 30*time.Second, "longest wait for room before 429")
	fs.BoolVar(&po.IncludeUsage, "include-usage", true, "ask backends for the usage chunk of streams that did not, so the policy learns cached tokens (the client sees the chunk)")
	cfg.disagg.registerSplit(fs) // disaggflags.go: --pd-split, ...
	fs.DurationVar(&cfg.grace, "grace", eppGrace, "on SIGTERM, how long open streams get to finish")
	fs.TextVar(&cfg.logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn or error")
	fs.IntVar(&cfg.gcFloor, "gc-floor-mib", defaultGCFloorMiB, "the heap may grow to this many MiB before the garbage collector runs; above it GOGC applies as usual (0: GOGC alone)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvroute epp --pool-name NAME [--pool-namespace NS] | --endpoint IP:PORT ... [flags]\n\n"+
			"Serves the endpoint picker of the Gateway API Inference Extension: an Envoy external\n"+
			"processor (ext_proc, FULL_DUPLEX_STREAMED bodies) that routes each request with kvroute's\n"+
			"policy and answers with x-gateway-destination-endpoint. See docs/epp.md.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	backendsFile, err := applySettings(fs, configPath, os.LookupEnv) // settings.go: KVROUTE_* and the file
	if err != nil {
		return cfg, err
	}
	sc.Backends = backendsFile
	// --header-list once chose the list in the header, now the default;
	// its false is the single address, kept for old command lines.
	po.OriginalDstHeader = po.OriginalDstHeader || !headerList
	cfg.discovery.configPath = configPath
	for _, e := range endpoints {
		if _, _, err := net.SplitHostPort(e); err != nil {
			return cfg, bySetting("endpoint", fmt.Errorf("endpoint %q: want ip:port: %v", e, err))
		}
		specs = append(specs, e+"=http://"+e)
	}
	for _, spec := range specs {
		b, err := fleet.ParseBackend(len(sc.Backends), spec)
		if err != nil {
			return cfg, backendError(err)
		}
		for _, other := range sc.Backends {
			if other.Name == b.Name || epp.Address(other) == epp.Address(b) {
				return cfg, fmt.Errorf("endpoint %q given twice", epp.Address(b))
			}
		}
		sc.Backends = append(sc.Backends, b)
		cfg.discovery.fixed = append(cfg.discovery.fixed, b)
	}
	if err := cfg.discovery.validate(); err != nil {
		return cfg, err
	}
	switch {
	case len(sc.Backends) == 0 && !cfg.discovery.dynamic():
		return cfg, errors.New("no endpoints: give --pool-name NAME, --endpoint IP:PORT, --backend URL, --config FILE, --k8s-service NAMESPACE/NAME or --dns NAME")
	case po.Fallbacks < 0:
		return cfg, fmt.Errorf("--fallbacks must not be negative, got %d", po.Fallbacks)
	case po.Admission.QueueTimeout < 0:
		return cfg, errors.New("--queue-timeout must not be negative")
	}
	if po.Admission.MaxQueue == 0 {
		po.Admission.MaxQueue = -1 // on the command line 0 means none
	}
	if err := core.check(); err != nil {
		return cfg, err
	}
	if cfg.gcFloor < 0 {
		return cfg, fmt.Errorf("--gc-floor-mib must not be negative, got %d", cfg.gcFloor)
	}
	if _, err := policies.New(sc.Policy, sc.Backends, sc.Router); err != nil {
		return cfg, err
	}
	if po.Splitter, err = cfg.disagg.split(); err != nil { // disaggflags.go
		return cfg, err
	}
	return cfg, nil
}

func runEpp(args []string, _, stderr io.Writer) int {
	cfg, err := parseEppFlags(args, stderr)
	if code, ok := flagsDone("epp", err, stderr); !ok {
		return code
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	ctx, stop := signalContext()
	defer stop()
	defer gctune.Start(uint64(cfg.gcFloor) << 20).Stop() // process-wide: not in runPicker
	if err := runPicker(ctx, cfg, log, nil); err != nil {
		log.Error("epp failed", "err", err)
		return 1
	}
	return 0
}

// runPicker runs the endpoint picker until ctx ends, then drains it. If
// ready is not nil it receives the gRPC address once the picker serves.
func runPicker(ctx context.Context, cfg eppConfig, log *slog.Logger, ready chan<- string) error {
	cfg.server.Logger = log
	var err error
	if cfg.server.Discovery, err = cfg.discovery.start(ctx, "", log); err != nil { // discoveryflags.go
		return err
	}
	s, err := epp.Start(ctx, cfg.server)
	if err != nil {
		return byListener(err, map[string]string{"gRPC": "grpc-listen", "metrics": "metrics-listen"}) // startuperrors.go
	}
	for _, b := range s.Fleet.Backends() {
		info := b.Info()
		if info == nil {
			log.Warn("endpoint not reachable yet", "endpoint", epp.Address(b), "url", b.URL.String())
			continue
		}
		log.Info("endpoint", "endpoint", epp.Address(b), "models", info.Models, "healthy", b.Healthy())
	}
	if s.MetricsURL != "" {
		log.Info("metrics serving", "url", s.MetricsURL+"/metrics")
	}
	log.Info("kvroute epp serving", "grpc", s.Addr, "policy", cfg.server.Policy, "endpoints", len(s.Fleet.Backends()),
		"discovery", cfg.server.Discovery != nil)
	if ready != nil {
		ready <- s.Addr
	}
	select {
	case <-ctx.Done():
		log.Info("shutting down", "signal", context.Cause(ctx), "grace", cfg.grace)
	case err := <-s.Err():
		s.Close()
		return err
	}
	gctx, cancel := context.WithTimeout(context.Background(), cfg.grace)
	defer cancel()
	s.Shutdown(gctx)
	log.Info("stopped")
	return nil
}
