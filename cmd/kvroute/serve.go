package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/router"
)

// serveConfig is what the serve flags decide.
type serveConfig struct {
	listen        string
	backends      []*fleet.Backend
	fleet         fleet.Options
	policy        string
	policyOpts    router.Options
	sessionHeader string
	logLevel      slog.Level
	security      securityConfig // securityflags.go
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

// parseServeFlags parses the serve subcommand's flags. Backends come from
// --backend flags, a --config file, or both (the file's first).
func parseServeFlags(args []string, output io.Writer) (serveConfig, error) {
	fs := flag.NewFlagSet("kvroute serve", flag.ContinueOnError)
	fs.SetOutput(output)
	var (
		cfg        serveConfig
		specs      stringList
		configPath string
	)
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:8080", "address the OpenAI-compatible API listens on")
	fs.Var(&specs, "backend", "a backend as [name=]URL, e.g. gpu0=http://127.0.0.1:8001 (repeatable)")
	fs.StringVar(&configPath, "config", "", "YAML file listing backends (backends: [{name, url}], scrape_interval, health_interval)")
	fs.StringVar(&cfg.policy, "policy", "kvroute", "routing policy: "+strings.Join(router.Names(), ", "))
	fs.StringVar(&cfg.sessionHeader, "session-header", proxy.DefaultSessionHeader, "request header carrying the session key")
	fs.DurationVar(&cfg.fleet.ScrapeInterval, "scrape-interval", time.Second, "how often backends' /metrics are scraped")
	fs.DurationVar(&cfg.fleet.HealthInterval, "health-interval", time.Second, "how often backends' /health is checked")
	fs.DurationVar(&cfg.fleet.Timeout, "probe-timeout", fleet.DefaultTimeout, "limit of each /health, /metrics and /v1/models probe (llama-server answers /metrics only between batches: give it seconds on CPUs)")
	fs.Float64Var(&cfg.policyOpts.KVRoute.LoadFactor, "load-factor", 2, "kvroute: no backend takes more than this × the mean in-flight requests (+4)")
	fs.IntVar(&cfg.policyOpts.KVRoute.BlockBytes, "block-bytes", 256, "kvroute: prefix index block size in bytes of prompt text")
	fs.IntVar(&cfg.policyOpts.KVRoute.Replicas, "replicas", 1, "kvroute: router replicas sharing these backends behind a random split (each scales its load counts and places sessions by consistent hashing)")
	fs.Uint64Var(&cfg.policyOpts.Seed, "seed", 0, "seed of random tie-breaks (0: random)")
	fs.TextVar(&cfg.logLevel, "log-level", slog.LevelInfo, "log level: debug (one line per request with its decision), info, warn or error")
	cfg.security.register(fs) // securityflags.go
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvroute serve --backend URL [--backend URL ...] [flags]\n\n"+
			"Serves the OpenAI API and routes every request to the backend where it is predicted to\n"+
			"finish soonest, given what each backend has cached and the work queued there.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	var set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if configPath != "" {
		fc, err := fleet.LoadConfig(configPath)
		if err != nil {
			return cfg, err
		}
		cfg.backends = fc.Backends
		if fc.ScrapeInterval > 0 && !set["scrape-interval"] {
			cfg.fleet.ScrapeInterval = fc.ScrapeInterval
		}
		if fc.HealthInterval > 0 && !set["health-interval"] {
			cfg.fleet.HealthInterval = fc.HealthInterval
		}
	}
	for _, spec := range specs {
		b, err := fleet.ParseBackend(len(cfg.backends), spec)
		if err != nil {
			return cfg, err
		}
		for _, other := range cfg.backends {
			if other.Name == b.Name {
				return cfg, fmt.Errorf("backend name %q used twice", b.Name)
			}
		}
		cfg.backends = append(cfg.backends, b)
	}
	switch {
	case len(cfg.backends) == 0:
		return cfg, errors.New("no backends: give --backend URL or --config FILE")
	case cfg.fleet.ScrapeInterval <= 0 || cfg.fleet.HealthInterval <= 0 || cfg.fleet.Timeout <= 0:
		return cfg, errors.New("--scrape-interval, --health-interval and --probe-timeout must be positive")
	case cfg.policyOpts.KVRoute.LoadFactor < 1:
		return cfg, fmt.Errorf("--load-factor must be at least 1, got %v", cfg.policyOpts.KVRoute.LoadFactor)
	case cfg.policyOpts.KVRoute.Replicas < 1:
		return cfg, fmt.Errorf("--replicas must be at least 1, got %d", cfg.policyOpts.KVRoute.Replicas)
	case cfg.policyOpts.KVRoute.BlockBytes < 16:
		return cfg, fmt.Errorf("--block-bytes must be at least 16, got %d", cfg.policyOpts.KVRoute.BlockBytes)
	}
	if _, err := router.New(cfg.policy, cfg.backends, cfg.policyOpts); err != nil {
		return cfg, err
	}
	if err := cfg.security.resolve(cfg.backends); err != nil { // securityflags.go
		return cfg, err
	}
	return cfg, nil
}

func runServe(args []string, _, stderr io.Writer) int {
	cfg, err := parseServeFlags(args, stderr)
	if code, ok := flagsDone("serve", err, stderr); !ok {
		return code
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	ctx, stop := signalContext()
	defer stop()
	if err := serve(ctx, cfg, log, nil); err != nil {
		log.Error("serve failed", "err", err)
		return 1
	}
	return 0
}

// serve runs the router until ctx ends. If ready is not nil it receives the
// listening address once the router serves.
func serve(ctx context.Context, cfg serveConfig, log *slog.Logger, ready chan<- string) error {
	cfg.fleet.Logger = log
	cfg.security.fleetOptions(&cfg.fleet) // securityflags.go: TLS to the backends
	fl := fleet.New(cfg.backends, cfg.fleet)
	cfg.policyOpts.Metrics = fl.Metrics // for peers that read scraped load
	policy, err := router.New(cfg.policy, cfg.backends, cfg.policyOpts)
	if err != nil {
		return err
	}
	px, err := proxy.New(cfg.security.proxyConfig(proxy.Config{Fleet: fl, Router: policy, SessionHeader: cfg.sessionHeader, Logger: log}))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return err
	}
	fl.Refresh(ctx)
	for _, b := range fl.Backends() {
		info := b.Info()
		if info == nil {
			log.Warn("backend not reachable yet", "backend", b.Name, "url", b.URL.String())
			continue
		}
		log.Info("backend", "backend", b.Name, "url", b.URL.String(), "models", info.Models, "kv_tokens", info.KVTokens(), "healthy", b.Healthy())
	}
	srv := &http.Server{Handler: px, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 3)
	ln, stopMetrics, err := cfg.security.listen(ln, px, log, errc) // securityflags.go: TLS, metrics listener
	if err != nil {
		return err
	}
	defer stopMetrics(context.Background())
	go func() { errc <- fl.Run(ctx) }()
	go func() { errc <- srv.Serve(ln) }()
	log.Info("kvroute serving", "url", cfg.security.scheme()+"://"+ln.Addr().String(), "policy", cfg.policy, "backends", len(cfg.backends))
	if ready != nil {
		ready <- ln.Addr().String()
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		srv.Close()
	}
	return nil
}
