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
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/server"
)

// serveConfig is what the serve flags decide.
type serveConfig struct {
	listen         string
	server         server.Config // timeouts, caps and drain of the listener
	resilience     proxy.Resilience
	overload       proxy.Overload
	connectTimeout time.Duration
	backends       []*fleet.Backend
	fleet          fleet.Options
	discovery      discoveryConfig
	policy         string
	policyOpts     router.Options
	sessionHeader  string
	logLevel       slog.Level
	logFormat      logFormat
	security       securityConfig // securityflags.go
	tracing        tracingConfig  // tracingflags.go
}

// discoveryConfig is what the discovery flags decide: with a --config file
// or a --dns name, the fleet follows them while kvroute runs.
type discoveryConfig struct {
	configPath     string
	configInterval time.Duration
	dns            stringList
	dnsInterval    time.Duration
	k8sService     string // NAMESPACE/NAME
	k8sPortName    string
	kubeconfig     string
	fixed          []*fleet.Backend // the --backend flags: they stay
}

// enabled reports whether the fleet changes at run time.
func (d *discoveryConfig) enabled() bool {
	return d.configPath != "" || len(d.dns) > 0 || d.k8sService != ""
}

// kubernetes is the Kubernetes source of the flags, nil without
// --k8s-service (checked by parseServeFlags).
func (d *discoveryConfig) kubernetes() *discovery.Kubernetes {
	if d.k8sService == "" {
		return nil
	}
	ns, name, _ := discovery.ParseService(d.k8sService)
	return &discovery.Kubernetes{Namespace: ns, Service: name, PortName: d.k8sPortName, Kubeconfig: d.kubeconfig}
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
	fs.StringVar(&configPath, "config", "", "YAML file: backends: [{name, url, api_key_env}], and any flag below as a key (first_token_floor: 15s)")
	fs.DurationVar(&cfg.discovery.configInterval, "config-interval", discovery.DefaultFileInterval, "how often the --config file is checked for changed backends (also re-read on SIGHUP; 0: only on SIGHUP)")
	fs.Var(&cfg.discovery.dns, "dns", "a DNS name whose addresses are backends, NAME[:PORT] (A/AAAA, port 8000 by default) or an SRV name starting with _ (repeatable)")
	fs.DurationVar(&cfg.discovery.dnsInterval, "dns-interval", discovery.DefaultDNSInterval, "how often --dns names are resolved again")
	fs.StringVar(&cfg.discovery.k8sService, "k8s-service", "", "a Kubernetes Service, NAMESPACE/NAME, whose ready endpoints (EndpointSlices, watched) are backends, named after their pods")
	fs.StringVar(&cfg.discovery.k8sPortName, "k8s-port-name", "", "the EndpointSlice port of --k8s-service to use (default: each slice's first)")
	fs.StringVar(&cfg.discovery.kubeconfig, "kubeconfig", "", "kubeconfig file for --k8s-service (default: the in-cluster service account)")
	fs.StringVar(&cfg.policy, "policy", "kvroute", "routing policy: "+strings.Join(router.Names(), ", "))
	fs.StringVar(&cfg.sessionHeader, "session-header", proxy.DefaultSessionHeader, "request header carrying the session key")
	fs.DurationVar(&cfg.fleet.ScrapeInterval, "scrape-interval", time.Second, "how often backends' /metrics are scraped")
	fs.DurationVar(&cfg.fleet.HealthInterval, "health-interval", time.Second, "how often backends' /health is checked")
	fs.DurationVar(&cfg.fleet.Timeout, "probe-timeout", fleet.DefaultTimeout, "limit of each /health, /metrics and /v1/models probe (llama-server answers /metrics only between batches: give it seconds on CPUs)")
	fs.Float64Var(&cfg.policyOpts.KVRoute.LoadFactor, "load-factor", 2, "kvroute: no backend takes more than this × the mean in-flight requests (+4)")
	fs.IntVar(&cfg.policyOpts.KVRoute.BlockBytes, "block-bytes", 256, "kvroute: prefix index block size in bytes of prompt text")
	fs.BoolVar(&cfg.policyOpts.KVRoute.FullScan, "full-scan", false, "kvroute: score every backend on every pick, not only the prefix holders and the 16 least loaded (above 64 backends; the pick's cost then grows with the fleet)")
	fs.IntVar(&cfg.policyOpts.KVRoute.Replicas, "replicas", 1, "kvroute: router replicas sharing these backends behind a random split (each scales its load counts and places sessions by consistent hashing)")
	fs.Uint64Var(&cfg.policyOpts.Seed, "seed", 0, "seed of random tie-breaks (0: random)")
	fs.TextVar(&cfg.logLevel, "log-level", slog.LevelInfo, "log level: debug (one line per request with its decision), info, warn or error")
	cfg.logFormat = logText
	fs.Var(&cfg.logFormat, "log-format", logFormatUsage)
	cfg.security.register(fs)   // securityflags.go
	registerHardening(fs, &cfg) // hardenflags.go
	cfg.tracing.register(fs)    // tracingflags.go
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
	backendsFile, err := applySettings(fs, configPath, os.LookupEnv) // settings.go: KVROUTE_* and the file
	if err != nil {
		return cfg, err
	}
	if backendsFile != nil {
		cfg.backends = backendsFile
	}
	cfg.discovery.configPath = configPath
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
		cfg.discovery.fixed = append(cfg.discovery.fixed, b)
	}
	if _, err := discovery.New(discovery.Config{DNS: cfg.discovery.dns}); err != nil {
		return cfg, fmt.Errorf("--dns: %w", err)
	}
	if cfg.discovery.k8sService != "" {
		if _, _, err := discovery.ParseService(cfg.discovery.k8sService); err != nil {
			return cfg, fmt.Errorf("--k8s-service: %w", err)
		}
	}
	switch {
	case len(cfg.backends) == 0 && len(cfg.discovery.dns) == 0 && cfg.discovery.k8sService == "":
		return cfg, errors.New("no backends: give --backend URL, --config FILE, --dns NAME or --k8s-service NAMESPACE/NAME")
	case cfg.discovery.configInterval < 0 || cfg.discovery.dnsInterval <= 0:
		return cfg, errors.New("--config-interval must not be negative and --dns-interval must be positive")
	case cfg.fleet.ScrapeInterval <= 0 || cfg.fleet.HealthInterval <= 0 || cfg.fleet.Timeout <= 0:
		return cfg, errors.New("--scrape-interval, --health-interval and --probe-timeout must be positive")
	case cfg.policyOpts.KVRoute.LoadFactor < 1:
		return cfg, fmt.Errorf("--load-factor must be at least 1, got %v", cfg.policyOpts.KVRoute.LoadFactor)
	case cfg.policyOpts.KVRoute.Replicas < 1:
		return cfg, fmt.Errorf("--replicas must be at least 1, got %d", cfg.policyOpts.KVRoute.Replicas)
	case cfg.resilience.MaxAttempts < 1:
		return cfg, fmt.Errorf("--max-attempts must be at least 1, got %d", cfg.resilience.MaxAttempts)
	case cfg.resilience.RetryBudget < 0 || cfg.resilience.RetryBudget > 1:
		return cfg, fmt.Errorf("--retry-budget must be between 0 and 1, got %v", cfg.resilience.RetryBudget)
	case cfg.resilience.FirstTokenFactor < 0 || cfg.fleet.Outlier.LatencyFactor < 0:
		return cfg, errors.New("--first-token-factor and --eject-latency-factor must not be negative")
	case cfg.connectTimeout <= 0 || cfg.overload.Admission.QueueTimeout < 0:
		return cfg, errors.New("--connect-timeout must be positive and --queue-timeout not negative")
	case cfg.policyOpts.KVRoute.BlockBytes < 16:
		return cfg, fmt.Errorf("--block-bytes must be at least 16, got %d", cfg.policyOpts.KVRoute.BlockBytes)
	}
	if _, err := router.New(cfg.policy, cfg.backends, cfg.policyOpts); err != nil {
		return cfg, err
	}
	if err := cfg.security.resolve(cfg.backends); err != nil { // securityflags.go
		return cfg, err
	}
	if _, err := cfg.tracing.exporterOptions(); err != nil { // tracingflags.go
		return cfg, err
	}
	return cfg, nil
}

func runServe(args []string, _, stderr io.Writer) int {
	cfg, err := parseServeFlags(args, stderr)
	if code, ok := flagsDone("serve", err, stderr); !ok {
		return code
	}
	log := newLogger(stderr, cfg.logFormat, cfg.logLevel)
	ctx, stop := signalContext()
	defer stop()
	if err := serve(ctx, cfg, log, nil); err != nil {
		log.Error("serve failed", "err", err)
		return 1
	}
	return 0
}

// serve runs the router until ctx ends, then drains it. If ready is not nil
// it receives the listening address once the router serves.
func serve(ctx context.Context, cfg serveConfig, log *slog.Logger, ready chan<- string) error {
	sc := cfg.server
	// On the command line 0 means none; in the Go configs it means the
	// default.
	for _, d := range []*time.Duration{&sc.DrainDelay, &sc.Grace, &sc.ReadHeaderTimeout, &sc.IdleTimeout,
		&cfg.resilience.FirstTokenFloor, &cfg.resilience.StreamIdleTimeout, &cfg.resilience.ResponseTimeout, &cfg.resilience.BodyReadTimeout} {
		if *d == 0 {
			*d = -1
		}
	}
	ej := &cfg.fleet.Outlier
	for _, n := range []*int{&sc.MaxConns, &cfg.overload.MaxPerBackend, &cfg.overload.Admission.MaxInFlight, &cfg.overload.Admission.MaxQueue,
		&ej.ConsecutiveGatewayErrors, &ej.Consecutive5xx, &ej.ConsecutiveTimeouts, &ej.ConsecutiveSlow, &ej.MaxEjectionPercent} {
		if *n == 0 {
			*n = -1
		}
	}
	sc.Backends, sc.Fleet, sc.Policy, sc.Router, sc.Listen, sc.Logger = cfg.backends, cfg.fleet, cfg.policy, cfg.policyOpts, cfg.listen, log
	cfg.security.fleetOptions(&sc.Fleet) // securityflags.go: TLS to the backends
	t := proxy.NewTransport()
	t.DialContext = (&net.Dialer{Timeout: cfg.connectTimeout, KeepAlive: 30 * time.Second}).DialContext
	sc.Proxy = cfg.security.proxyConfig(proxy.Config{SessionHeader: cfg.sessionHeader, Logger: log, Transport: t,
		Resilience: cfg.resilience, Overload: cfg.overload})
	sc.TLS, sc.MetricsListen = cfg.security.serverTLS, cfg.security.metricsListen
	tp, stopTracing, err := cfg.tracing.start(ctx) // tracingflags.go
	if err != nil {
		return err
	}
	defer stopTracing() // after the drain below: the last spans are flushed
	sc.Proxy.TracerProvider = tp
	if dc := cfg.discovery; dc.enabled() {
		every := dc.configInterval
		if every == 0 {
			every = -1 // only on SIGHUP
		}
		d, err := discovery.New(discovery.Config{Fixed: dc.fixed, File: dc.configPath, FileInterval: every,
			DNS: dc.dns, DNSInterval: dc.dnsInterval, Kubernetes: dc.kubernetes(), APIKey: cfg.security.backendAPIKey, Logger: log})
		if err != nil {
			return err
		}
		sc.Discovery = d
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go func() {
			for {
				select {
				case <-hup:
					d.Reload()
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	s, err := server.Start(ctx, sc)
	if err != nil {
		return err
	}
	for _, b := range s.Fleet.Backends() {
		info := b.Info()
		if info == nil {
			log.Warn("backend not reachable yet", "backend", b.Name, "url", b.URL.String())
			continue
		}
		log.Info("backend", "backend", b.Name, "url", b.URL.String(), "models", info.Models, "kv_tokens", info.KVTokens(), "healthy", b.Healthy())
	}
	if s.MetricsURL != "" {
		log.Info("metrics serving", "url", s.MetricsURL+"/metrics")
	}
	log.Info("kvroute serving", "url", s.URL, "policy", cfg.policy, "backends", len(s.Fleet.Backends()),
		"discovery", sc.Discovery != nil)
	if ready != nil {
		ready <- strings.TrimPrefix(strings.TrimPrefix(s.URL, "http://"), "https://")
	}
	select {
	case <-ctx.Done():
		log.Info("shutting down", "signal", context.Cause(ctx))
	case err := <-s.Err():
		s.Close()
		return err
	}
	return s.Shutdown(context.Background())
}
