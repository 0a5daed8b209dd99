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
	"os"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/fleetpage"
	"github.com/kvroute/kvroute/internal/gctune"
	"github.com/kvroute/kvroute/internal/peers"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/router/kvroute"
	"github.com/kvroute/kvroute/internal/router/policies"
	"github.com/kvroute/kvroute/internal/server"
	"github.com/kvroute/kvroute/internal/upstream"
)

// serveConfig is what the serve flags decide.
type serveConfig struct {
	listen         string
	server         server.Config // timeouts, caps and drain of the listener
	resilience     proxy.Resilience
	overload       proxy.Overload
	connectTimeout time.Duration
	stdlibUpstream bool // hardenflags.go
	netConnIO      bool // hardenflags.go
	gcFloorMiB     int  // hardenflags.go
	migrate        bool // hardenflags.go
	backends       []*fleet.Backend
	fleet          fleet.Options
	discovery      discoveryConfig
	policy         string
	policyOpts     policies.Options
	sessionHeader  string
	logLevel       slog.Level
	logFormat      logFormat
	security       securityConfig     // securityflags.go
	tracing        tracingConfig      // tracingflags.go
	duplicates     []duplicateBackend // dedupe.go: --backend flags dropped, logged at start
	kvEvents       kvEventsConfig     // kveventsflags.go
	explain        bool
	disagg         disaggConfig // disaggflags.go
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
	dpRanks := dpRankFlag{}
	fs.Var(dpRanks, "dp-ranks", "NAME=N: the --backend called NAME is a server of N data-parallel ranks (vLLM --data-parallel-size), routed to as N backends NAME/dp0… with the X-data-parallel-rank header (repeatable)")
	fs.StringVar(&configPath, "config", "", "YAML file: backends: [{name, url, api_key_env}], and any flag below as a key (first_token_floor: 15s)")
	cfg.discovery.register(fs) // discoveryflags.go
	core := coreFlags{&cfg.policy, &cfg.fleet, &cfg.policyOpts, &cfg.sessionHeader}
	core.register(fs) // coreflags.go: --policy, --scrape-interval, --load-factor, ...
	fs.IntVar(&cfg.policyOpts.KVRoute.Replicas, "replicas", 1, "kvroute: router replicas sharing these backends behind a random split (each scales its load counts and places sessions by consistent hashing)")
	fs.Var((*stringList)(&cfg.server.Peers.Peers), "peer", "another router replica, http://HOST:PORT of its metrics listener (or API, without one), or dns+http://NAME:PORT for every address of a headless Service: its in-flight counts are added to this replica's (repeatable; needs --replicas)")
	fs.BoolVar(&cfg.server.Peers.Push, "peer-push", true, "follow each --peer's stream of its counts, pushed as they change, instead of polling it (a peer without the stream is polled)")
	fs.DurationVar(&cfg.server.Peers.ReconnectMax, "peer-reconnect-max", peers.DefaultReconnectMax, "longest wait before following a --peer's stream again after it failed (the waits double from 50ms)")
	fs.DurationVar(&cfg.server.Peers.Interval, "peer-interval", peers.DefaultInterval, "how often the --peer replicas that do not stream are polled, and the stream's heartbeat")
	fs.DurationVar(&cfg.server.Peers.Timeout, "peer-timeout", peers.DefaultTimeout, "limit of one poll of one --peer, of the wait for its stream, and of one line's write to a replica following this one")
	fs.DurationVar(&cfg.policyOpts.KVRoute.PeerPush, "peer-push-delay", kvroute.DefaultPeerPush, "with --peer-push and --kv-events: how late a --peer's pushed count may reach this replica; it then decides as one router but while its own picks come closer than this (a burst the others' counts have not caught up with: then as a replica, in its lane of the backends); 0: always as a replica")
	fs.DurationVar(&cfg.policyOpts.KVRoute.PeerMaxAge, "peer-max-age", kvroute.DefaultPeerMaxAge, "a --peer's counts older than this stop counting; the replica then scales its own by --replicas")
	fs.BoolVar(&cfg.explain, "explain-headers", false, "add the policy's predicted cached prompt tokens and TTFT to every response (X-Kvroute-Predicted-Cached, X-Kvroute-Predicted-Ttft-Ms); they tell clients what the fleet has cached, so only for trusted ones")
	fs.TextVar(&cfg.logLevel, "log-level", slog.LevelInfo, "log level: debug (one line per request with its decision), info, warn or error")
	cfg.logFormat = logText
	fs.Var(&cfg.logFormat, "log-format", logFormatUsage)
	cfg.security.register(fs)   // securityflags.go
	registerHardening(fs, &cfg) // hardenflags.go
	cfg.tracing.register(fs)    // tracingflags.go
	cfg.kvEvents.register(fs)   // kveventsflags.go
	cfg.disagg.register(fs)     // disaggflags.go
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
			return cfg, backendError(err)
		}
		if other := sameServer(cfg.backends, b.URL); other != nil { // dedupe.go
			cfg.duplicates = append(cfg.duplicates, duplicateBackend{b.Name, b.URL.String(), other.Name})
			continue
		}
		for _, other := range cfg.backends {
			if other.Name == b.Name {
				return cfg, fmt.Errorf("backend name %q used twice", b.Name)
			}
		}
		ranks, err := fleet.ExpandRanks(b, dpRanks[b.Name]) // dprankflags.go
		if err != nil {
			return cfg, err
		}
		cfg.backends = append(cfg.backends, ranks...)
		cfg.discovery.fixed = append(cfg.discovery.fixed, ranks...)
	}
	if err := dpRanks.unused(cfg.backends); err != nil {
		return cfg, err
	}
	if err := cfg.disagg.addBackends(&cfg); err != nil { // disaggflags.go
		return cfg, err
	}
	if err := cfg.discovery.validate(); err != nil { // discoveryflags.go
		return cfg, err
	}
	switch {
	case len(cfg.backends) == 0 && !cfg.discovery.dynamic():
		return cfg, errors.New("no backends: give --backend URL, --config FILE, --dns NAME, --k8s-service NAMESPACE/NAME or --pool-name NAME")
	case cfg.policyOpts.KVRoute.Replicas < 1:
		return cfg, fmt.Errorf("--replicas must be at least 1, got %d", cfg.policyOpts.KVRoute.Replicas)
	case len(cfg.server.Peers.Peers) > 0 && cfg.policyOpts.KVRoute.Replicas < 2:
		return cfg, errors.New("--peer needs --replicas N: the number of router replicas, this one included")
	case cfg.server.Peers.Interval <= 0 || cfg.server.Peers.Timeout <= 0 || cfg.policyOpts.KVRoute.PeerMaxAge <= 0 || cfg.server.Peers.ReconnectMax <= 0:
		return cfg, errors.New("--peer-interval, --peer-timeout, --peer-max-age and --peer-reconnect-max must be positive")
	case cfg.policyOpts.KVRoute.PeerPush < 0:
		return cfg, fmt.Errorf("--peer-push-delay must not be negative, got %v", cfg.policyOpts.KVRoute.PeerPush)
	case cfg.resilience.MaxAttempts < 1:
		return cfg, fmt.Errorf("--max-attempts must be at least 1, got %d", cfg.resilience.MaxAttempts)
	case cfg.resilience.RetryBudget < 0 || cfg.resilience.RetryBudget > 1:
		return cfg, fmt.Errorf("--retry-budget must be between 0 and 1, got %v", cfg.resilience.RetryBudget)
	case cfg.resilience.FirstTokenFactor < 0 || cfg.fleet.Outlier.LatencyFactor < 0:
		return cfg, errors.New("--first-token-factor and --eject-latency-factor must not be negative")
	case cfg.connectTimeout <= 0 || cfg.overload.Admission.QueueTimeout < 0:
		return cfg, errors.New("--connect-timeout must be positive and --queue-timeout not negative")
	case cfg.gcFloorMiB < 0:
		return cfg, fmt.Errorf("--gc-floor-mib must not be negative, got %d", cfg.gcFloorMiB)
	}
	if err := core.check(); err != nil {
		return cfg, err
	}
	if len(cfg.server.Peers.Peers) == 0 || !cfg.server.Peers.Push {
		cfg.policyOpts.KVRoute.PeerPush = 0 // polled counts are a poll old
	}
	if _, err := policies.New(cfg.policy, cfg.backends, cfg.policyOpts); err != nil {
		return cfg, err
	}
	if err := peers.Validate(cfg.server.Peers.Peers); err != nil {
		return cfg, fmt.Errorf("--peer: %w", err)
	}
	if err := cfg.security.resolve(cfg.backends); err != nil { // securityflags.go
		return cfg, err
	}
	if _, err := cfg.tracing.exporterOptions(); err != nil { // tracingflags.go
		return cfg, err
	}
	if _, err := cfg.kvEvents.config(nil); err != nil { // kveventsflags.go
		return cfg, err
	}
	if _, err := cfg.disagg.config(); err != nil { // disaggflags.go
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
	for _, d := range cfg.duplicates {
		log.Warn("backend given twice: routing to it once", "backend", d.name, "url", d.url, "same_as", d.kept)
	}
	ctx, stop := signalContext()
	defer stop()
	// Process-wide, so here and not in serve, which tests run several of.
	defer gctune.Start(uint64(cfg.gcFloorMiB) << 20).Stop()
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
		&cfg.resilience.FirstTokenFloor, &cfg.resilience.StreamIdleTimeout, &cfg.resilience.ResponseTimeout, &cfg.resilience.BodyReadTimeout,
		&cfg.resilience.ResponseFloor} {
		if *d == 0 {
			*d = -1
		}
	}
	if !cfg.migrate {
		cfg.resilience.MaxMigrations = -1
	}
	ej := &cfg.fleet.Outlier
	for _, n := range []*int{&cfg.resilience.MaxMigrations, &sc.MaxConns, &cfg.overload.MaxPerBackend, &cfg.overload.Admission.MaxInFlight, &cfg.overload.Admission.MaxQueue,
		&ej.ConsecutiveGatewayErrors, &ej.Consecutive5xx, &ej.ConsecutiveTimeouts, &ej.ConsecutiveSlow, &ej.MaxEjectionPercent} {
		if *n == 0 {
			*n = -1
		}
	}
	sc.Backends, sc.Fleet, sc.Policy, sc.Router, sc.Listen, sc.Logger = cfg.backends, cfg.fleet, cfg.policy, cfg.policyOpts, cfg.listen, log
	cfg.security.fleetOptions(&sc.Fleet) // securityflags.go: TLS to the backends
	t := upstream.NewTransport()
	t.DialContext = (&net.Dialer{Timeout: cfg.connectTimeout, KeepAlive: 30 * time.Second}).DialContext
	sc.Proxy = cfg.security.proxyConfig(proxy.Config{SessionHeader: cfg.sessionHeader, Logger: log, Transport: t, StdlibUpstream: cfg.stdlibUpstream, NetConnIO: cfg.netConnIO,
		Resilience: cfg.resilience, Overload: cfg.overload, Explain: cfg.explain})
	disagg, derr := cfg.disagg.config() // disaggflags.go
	if derr != nil {
		return derr
	}
	sc.Proxy.Disagg = disagg
	sc.TLS, sc.MetricsListen, sc.FleetPage = cfg.security.serverTLS, cfg.security.metricsListen, cfg.security.fleetPage
	kv, err := cfg.kvEvents.config(&http.Client{Transport: t}) // kveventsflags.go
	if err != nil {
		return err
	}
	sc.KVEvents = kv
	tp, stopTracing, err := cfg.tracing.start(ctx) // tracingflags.go
	if err != nil {
		return err
	}
	defer stopTracing() // after the drain below: the last spans are flushed
	sc.Proxy.TracerProvider = tp
	if sc.Discovery, err = cfg.discovery.start(ctx, cfg.security.backendAPIKey, log); err != nil { // discoveryflags.go
		return err
	}
	s, err := server.Start(ctx, sc)
	if err != nil {
		return byListener(err, map[string]string{"API": "listen", "metrics": "metrics-listen"}) // startuperrors.go
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
	if s.Page != nil {
		log.Info("fleet page serving", "url", s.MetricsURL+fleetpage.PagePath)
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
