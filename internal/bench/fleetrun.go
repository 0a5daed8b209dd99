package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/balancer"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/kvevents/follow"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/router/kvroute"
	"github.com/kvroute/kvroute/internal/router/policies"
	"github.com/kvroute/kvroute/internal/server"
)

// FleetConfig describes a fleet behind a kvroute router (or a real
// balancer): emulated servers in this process on loopback, or real servers
// already running.
type FleetConfig struct {
	// BackendURLs, when set, are running OpenAI-compatible servers (for
	// example llama-server) to use instead of emulated ones; Backends,
	// Profile and TimeScale are then ignored (real servers run in real
	// time).
	BackendURLs []string
	// Backends is the number of emulated servers.
	Backends int
	// Profile is their engine profile; Servers, when set, each one's own
	// (a fleet of GPU generations, mixed.go).
	Profile engine.Profile
	Servers []engine.Profile
	// TimeScale is wall time per model second (0.1 = ten times faster).
	TimeScale float64
	// Policy is the router's --policy, or a real balancer (balancer.Kinds())
	// to put in front of the backends instead of kvroute.
	Policy string
	// Seed seeds the policy and the emulators.
	Seed uint64
	// KVRoute tunes the kvroute policy (its objective).
	KVRoute kvroute.Config
	// KVEvents makes the emulators publish their KV events on loopback
	// ports and the router follow them, as `serve --kv-events` would.
	KVEvents bool
	// TokenizeTimeout limits the router's /tokenize calls while it
	// follows KV events (serve's --kv-events-tokenize-timeout); 0: serve's
	// default.
	TokenizeTimeout time.Duration
	// Logger receives the components' logs; nil discards them.
	Logger *slog.Logger
	// LoRA, when not nil, makes the emulators serve LoRA adapters with
	// these limits, LoRAModules from the start.
	LoRA        *engine.LoRA
	LoRAModules []emulator.LoRAModule
	// DataParallel, above 1, makes every emulated server that many
	// data-parallel ranks, each a backend of the router's (dprank.go).
	DataParallel int
	// Prefill is how many of the emulated Backends are prefill servers
	// (the last ones; disagg.go); a Policy POLICY@SPLITTER splits with
	// that splitter.
	Prefill int
}

// Fleet is a running fleet and its router.
type Fleet struct {
	// URL is the router's base URL.
	URL string
	// Model is the model the backends serve.
	Model string
	// Servers are the emulated backends (none for real ones); Names the
	// backends' names. Restart replaces a server: read Servers through
	// Server when a fault schedule may be running.
	Servers []*emulator.Server
	Names   []string
	// watch scrapes real backends for the load samples.
	watch *fleet.Fleet

	ctx      context.Context // the fleet's; the emulators run until it is done
	cancel   context.CancelFunc
	router   *server.Server // nil when a real balancer fronts the fleet
	wg       sync.WaitGroup // the emulators' drivers and servers
	emuCfg   emulator.Config
	profiles []engine.Profile // each emulator's, when they differ
	servers  []*http.Server
	balancer *balancer.Balancer // when a real balancer fronts the fleet

	// mu guards Servers and everything below, which Kill and Restart change
	// while the load sampler reads.
	mu sync.Mutex
	// emu holds, per emulated backend, its HTTP server, its address (a
	// restart listens on the same one, so that the router and the balancers
	// find it again) and what stops its driver.
	emu []emuBackend
	// retired sums, per backend, the counters of the servers Restart
	// replaced, so that the run's totals span the restart.
	retired []backendStats
	// backends and prefill give each emulator its part (disagg.go).
	backends, prefill int
}

// emuBackend is one emulated backend's process stand-in.
type emuBackend struct {
	srv    *http.Server // nil while killed
	addr   string
	cancel context.CancelFunc // stops the emulator's driver
	// events are its KV event sockets, PUB and replay ("" without
	// FleetConfig.KVEvents): a restart binds them again.
	events kvevents.Source
}

// StartFleet starts cfg.Backends emulators and a router in front of them,
// each on its own loopback port, and waits until the router knows every
// backend. Close stops everything.
func StartFleet(ctx context.Context, cfg FleetConfig) (*Fleet, error) {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	f := &Fleet{ctx: ctx, cancel: cancel}
	fail := func(err error) (*Fleet, error) {
		f.Close()
		return nil, err
	}
	var (
		backends []*fleet.Backend
		urls     []string
		err      error
		opts     = fleet.Options{Logger: logger, Outlier: scaledEjection(cfg)}
	)
	if len(cfg.BackendURLs) > 0 {
		backends, urls, err = f.attach(ctx, cfg.BackendURLs, logger)
		// A real engine answers /metrics between batches: behind a long
		// prefill the answer can take seconds.
		opts.Timeout = realProbeTimeout
	} else {
		backends, urls, err = f.emulate(ctx, cfg, logger)
	}
	if err != nil {
		return fail(err)
	}
	if IsBalancer(cfg.Policy) {
		// A real balancer in front instead of kvroute.
		b, err := balancer.Start(ctx, cfg.Policy, urls, logger)
		if err != nil {
			return fail(err)
		}
		f.balancer, f.URL = b, b.URL
		return f, nil
	}
	// The router as `kvroute serve` runs it, on a loopback port of its own,
	// its predictions in each response for the report's accuracy.
	policy, pd, err := disagg(cfg, backends) // disagg.go
	if err != nil {
		return fail(err)
	}
	rs, err := server.Start(ctx, server.Config{Backends: backends, Fleet: opts, Policy: policy,
		Router: policies.Options{Seed: cfg.Seed, KVRoute: cfg.KVRoute}, KVEvents: f.following(cfg.TokenizeTimeout),
		Proxy:  proxy.Config{Logger: logger, Resilience: scaledTimeouts(cfg), Explain: true, Disagg: pd},
		Listen: "127.0.0.1:0", DrainDelay: -1, Logger: logger})
	if err != nil {
		return fail(err)
	}
	f.router = rs
	if !rs.Fleet.Ready() {
		return fail(errors.New("the backends did not come up"))
	}
	f.URL = rs.URL
	return f, nil
}

// scaledTimeouts are the proxy's default first-token floor and idle timeout
// in the emulators' model time (a tenth of them at --time-scale 0.1), so
// that a faster-than-real run meets the same deadlines a real one would;
// never under a second or two of wall time, the machine's own noise.
func scaledTimeouts(cfg FleetConfig) proxy.Resilience {
	scale := cfg.TimeScale
	if len(cfg.BackendURLs) > 0 || scale <= 0 || scale > 1 {
		return proxy.Resilience{}
	}
	at := func(d, least time.Duration) time.Duration { return max(least, time.Duration(float64(d)*scale)) }
	return proxy.Resilience{FirstTokenFloor: at(proxy.DefaultFirstTokenFloor, time.Second),
		StreamIdleTimeout: at(proxy.DefaultStreamIdleTimeout, 2*time.Second)}
}

// scaledEjection is outlier ejection with its default ejection times in the
// emulators' model time, as scaledTimeouts: a 30 s ejection must not
// outlast a whole faster-than-real run.
func scaledEjection(cfg FleetConfig) fleet.OutlierOptions {
	scale := cfg.TimeScale
	if len(cfg.BackendURLs) > 0 || scale <= 0 || scale > 1 {
		return fleet.OutlierOptions{}
	}
	at := func(d time.Duration) time.Duration { return max(time.Second, time.Duration(float64(d)*scale)) }
	return fleet.OutlierOptions{BaseEjectionTime: at(fleet.DefaultBaseEjectionTime), MaxEjectionTime: at(fleet.DefaultMaxEjectionTime)}
}

// realProbeTimeout bounds each probe of a real backend.
const realProbeTimeout = 10 * time.Second

// emulate starts cfg.Backends emulators, each on its own loopback port.
func (f *Fleet) emulate(ctx context.Context, cfg FleetConfig, logger *slog.Logger) ([]*fleet.Backend, []string, error) {
	var (
		backends []*fleet.Backend
		urls     []string
	)
	f.emuCfg = emulator.Config{Profile: cfg.Profile, TimeScale: cfg.TimeScale, Seed: cfg.Seed, Logger: logger,
		LoRA: cfg.LoRA, LoRAModules: cfg.LoRAModules}
	f.profiles = cfg.Servers
	f.backends, f.prefill = cfg.Backends, cfg.Prefill
	if cfg.DataParallel > 1 {
		return f.emulateRanks(ctx, cfg) // dprank.go
	}
	for i := range cfg.Backends {
		var events kvevents.Source
		if cfg.KVEvents {
			events = kvevents.Source{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0"}
		}
		ec := f.emulatorConfig(i, events)
		ec.Disagg = f.roleOf(i) // disagg.go
		s, err := emulator.New(ec)
		if err != nil {
			return nil, nil, err
		}
		if cfg.KVEvents {
			events.Endpoint, events.Replay = s.KVEventsAddr()
		}
		f.Model = s.Model()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, err
		}
		f.emu = append(f.emu, emuBackend{addr: ln.Addr().String(), events: events})
		f.retired = append(f.retired, backendStats{})
		f.Servers = append(f.Servers, s)
		f.start(i, s, ln)
		u, err := url.Parse("http://" + f.emu[i].addr)
		if err != nil {
			return nil, nil, err
		}
		f.Names = append(f.Names, fmt.Sprintf("gpu%d", i))
		backends = append(backends, fleet.NewBackend(i, f.Names[i], u))
		urls = append(urls, u.String())
	}
	return backends, urls, nil
}

// withEvents is the emulators' config, publishing KV events on events'
// sockets when it names them.
func (f *Fleet) withEvents(events kvevents.Source) emulator.Config {
	cfg := f.emuCfg
	if events.Endpoint != "" {
		cfg.KVEvents = &kvevents.PublisherConfig{Endpoint: events.Endpoint, Replay: events.Replay}
	}
	return cfg
}

// following is what the router follows of the emulators' KV events; nil
// when they publish none.
func (f *Fleet) following(tokenize time.Duration) *follow.FollowConfig {
	eps := map[string]kvevents.Source{}
	for i, b := range f.emu {
		if b.events.Endpoint != "" {
			eps[f.Names[i]] = b.events
		}
	}
	if len(eps) == 0 {
		return nil
	}
	fc := &follow.FollowConfig{Endpoints: eps, Retry: 50 * time.Millisecond}
	if tokenize > 0 {
		fc.Tokenizer = follow.NewTokenizer(nil, tokenize, 0)
	}
	return fc
}

// attach checks that the real servers at rawURLs are up and serve a common
// model, names them by host:port, and keeps a fleet of its own watching
// them for the load samples. It returns the router's backends and their
// URLs.
func (f *Fleet) attach(ctx context.Context, rawURLs []string, logger *slog.Logger) ([]*fleet.Backend, []string, error) {
	var backends, watched []*fleet.Backend
	var urls []string
	for i, raw := range rawURLs {
		u, err := url.Parse(strings.TrimRight(strings.TrimSpace(raw), "/"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, nil, fmt.Errorf("backend URL %q: want http://HOST:PORT", raw)
		}
		f.Names = append(f.Names, u.Host)
		backends = append(backends, fleet.NewBackend(i, u.Host, u))
		watched = append(watched, fleet.NewBackend(i, u.Host, u))
		urls = append(urls, u.String())
	}
	f.watch = fleet.New(watched, fleet.Options{Logger: logger, Timeout: realProbeTimeout})
	f.watch.Refresh(ctx)
	var common []string
	for i, b := range watched {
		info := b.Info()
		if !b.Healthy() || info == nil {
			return nil, nil, fmt.Errorf("backend %s is not up (health or /v1/models failed)", urls[i])
		}
		if i == 0 {
			common = slices.Clone(info.Models)
		} else {
			common = slices.DeleteFunc(common, func(m string) bool { return !info.Serves(m) })
		}
	}
	if len(common) == 0 {
		return nil, nil, errors.New("the backends serve no model in common")
	}
	f.Model = common[0]
	return backends, urls, nil
}

// start runs emulator s as backend i, serving on ln. f.mu is held or
// nothing else runs yet.
func (f *Fleet) start(i int, s *emulator.Server, ln net.Listener) {
	ctx, cancel := context.WithCancel(f.ctx)
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	f.emu[i].srv, f.emu[i].cancel = srv, cancel
	f.wg.Go(func() { s.Run(ctx) })
	f.wg.Go(func() { srv.Serve(ln) })
}

// Server returns emulated backend i as it is now (Restart replaces it).
func (f *Fleet) Server(i int) *emulator.Server {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Servers[i]
}

// Kill stops emulated backend i as SIGKILL would stop a server process: its
// listener closes, its connections drop mid-response (http.Server.Close, not
// Shutdown, which would let them finish) and its engine stops. Killing a
// killed backend does nothing.
func (f *Fleet) Kill(i int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i < 0 || i >= len(f.emu) {
		return fmt.Errorf("no emulated backend %d (the fleet has %d)", i, len(f.emu))
	}
	b := &f.emu[i]
	if b.srv == nil {
		return nil
	}
	err := b.srv.Close()
	b.cancel()
	b.srv, b.cancel = nil, nil
	// Its KV event sockets go with it, and free their ports for Restart.
	return errors.Join(err, f.Servers[i].Close())
}

// Restart starts a fresh emulator, with an empty cache as a restarted
// server has, on killed backend i's address. Restarting a running backend
// does nothing.
func (f *Fleet) Restart(i int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i < 0 || i >= len(f.emu) {
		return fmt.Errorf("no emulated backend %d (the fleet has %d)", i, len(f.emu))
	}
	b := &f.emu[i]
	if b.srv != nil {
		return nil
	}
	ec := f.emulatorConfig(i, b.events)
	ec.Disagg = f.roleOf(i) // disagg.go
	s, err := emulator.New(ec)
	if err != nil {
		return err
	}
	// Listeners set SO_REUSEADDR, so the old connections in TIME_WAIT do
	// not hold the port; a bind can still race with another process.
	var ln net.Listener
	for try := 0; ; try++ {
		if ln, err = net.Listen("tcp", b.addr); err == nil || try == 50 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("restart backend %d on %s: %w", i, b.addr, err)
	}
	old := f.Servers[i].Stats()
	r := &f.retired[i]
	r.busy += old.BusyTime
	r.prompt += old.PrefixQueries
	r.cached += old.PrefixHits
	r.loraLoads += old.LoRALoads
	f.Servers[i] = s
	f.start(i, s, ln)
	return nil
}

// serve starts h on a fresh loopback port.
func (f *Fleet) serve(h http.Handler) (*url.URL, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	f.servers = append(f.servers, srv)
	f.wg.Go(func() { srv.Serve(ln) })
	return url.Parse("http://" + ln.Addr().String())
}

// Close stops the router (or balancer) and the backends, and waits for
// every goroutine StartFleet started.
func (f *Fleet) Close() {
	if f.router != nil {
		f.router.Close()
	}
	if f.balancer != nil {
		f.balancer.Close()
	}
	f.cancel()
	for _, s := range f.servers {
		s.Close()
	}
	f.mu.Lock()
	for i, b := range f.emu {
		if b.srv != nil {
			b.srv.Close()
			f.Servers[i].Close() // its KV event sockets
		}
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// IsBalancer reports whether name is one of balancer.Kinds().
func IsBalancer(name string) bool {
	for _, b := range balancer.Kinds() {
		if b == name {
			return true
		}
	}
	return false
}

// migrations returns the router's kvroute_migrations_total by outcome, nil
// when no kvroute router fronts the fleet.
func (f *Fleet) migrations() map[string]int {
	if f.router == nil {
		return nil
	}
	g, ok := f.router.Proxy.Registerer().(prometheus.Gatherer)
	if !ok {
		return nil
	}
	fams, err := g.Gather()
	if err != nil {
		return nil
	}
	out := map[string]int{}
	for _, mf := range fams {
		if mf.GetName() != "kvroute_migrations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					out[l.GetValue()] += int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return out
}
