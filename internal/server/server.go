// Package server assembles a running kvroute: the fleet of backends with its
// health and scrape loops, the routing policy behind a router, the proxy, and
// the listeners; and it takes them down in order, draining first. `kvroute
// serve`, the bench's fleet runner and the endpoint picker all start their
// router here, and Close waits for everything Start started.
package server

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/fleetpage"
	"github.com/kvroute/kvroute/internal/kvevents/follow"
	"github.com/kvroute/kvroute/internal/peers"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/kvroute"
	"github.com/kvroute/kvroute/internal/router/policies"
)

// Defaults of Config. Each is in docs/operations.md with its reason.
const (
	// DefaultReadHeaderTimeout bounds a request's headers: a client that
	// opens a connection and says nothing is cut (Go's default is none).
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultIdleTimeout closes a kept-alive connection idle this long
	// (nginx's keepalive_timeout is 75 s).
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultMaxConns caps the open client connections, so that a flood of
	// idle or slow ones cannot exhaust file descriptors.
	DefaultMaxConns = 10_000
	// DefaultDrainDelay is how long /readyz answers 503 before the listener
	// stops accepting: a load balancer probing every 5 s with a threshold
	// of 1 notices within it.
	DefaultDrainDelay = 5 * time.Second
	// DefaultGrace is how long requests in flight get to finish once the
	// listener is closed: long enough for most generations, short of the
	// 60-90 s a Kubernetes pod is given before SIGKILL (with the delay).
	DefaultGrace = 45 * time.Second
)

// Config describes a router to start. Policy is required, and Backends or
// Discovery.
type Config struct {
	// Backends are the fleet (their Index fields numbering them 0..n-1).
	// With Discovery they are ignored: the fleet starts as Discovery
	// resolves it.
	Backends []*fleet.Backend
	// Discovery, when not nil, keeps the fleet current while the server
	// runs (a re-read config file, DNS names): Start resolves it once for
	// the initial fleet, then runs its loop until Shutdown or Close, each
	// change applied with fleet.Fleet.Update and told to the policy.
	Discovery *discovery.Discovery
	// Fleet configures health checks, scrapes and outlier ejection.
	Fleet fleet.Options
	// Policy is the routing policy's name (policies.Names); Router its
	// options (Metrics is filled in from the fleet).
	Policy string
	Router policies.Options
	// Proxy configures the proxy; its Fleet and Router are filled in.
	Proxy proxy.Config
	// Listen is the API's address ("127.0.0.1:0" picks a free port).
	Listen string
	// TLS, when not nil, serves the API over HTTPS.
	TLS *tls.Config
	// MetricsListen, when not empty, serves /metrics (and /healthz) on a
	// listener of its own; set Proxy.Security.MetricsElsewhere with it.
	MetricsListen string
	// FleetPage serves the live fleet page (internal/fleetpage) at /fleet
	// and /fleet.json on the metrics listener, and keeps the router's last
	// decisions for it. Without a metrics listener it is not served: the
	// page names backends and shows clients' models, as /metrics does, and
	// the API listener's keys are the proxy's to check.
	FleetPage bool
	// ReadHeaderTimeout, IdleTimeout and MaxConns bound client connections
	// (defaults above; negative: none).
	ReadHeaderTimeout, IdleTimeout time.Duration
	MaxConns                       int
	// DrainDelay and Grace pace Shutdown (defaults above; negative: none).
	DrainDelay, Grace time.Duration
	// Peers, when it lists any, follows the other router replicas'
	// in-flight counts (internal/peers): by their streams with Push, else
	// by polls; its MaxAge defaults to the policy's PeerMaxAge. Every
	// server serves its own counts at peers.Path, and their stream at
	// peers.StreamPath, on its metrics listener, or on its API listener
	// when it follows peers and has no metrics listener.
	Peers peers.Options
	// Logger receives the components' logs; nil means slog.Default().
	Logger *slog.Logger
	// KVEvents, when not nil, follows the backends' engine KV events and
	// gives kvroute their exact cached blocks (internal/kvevents); its
	// Metrics and Log are filled in.
	KVEvents *follow.FollowConfig
}

// Server is a running router.
type Server struct {
	// Fleet, Router and Proxy are the running parts.
	Fleet  *fleet.Fleet
	Router *router.Router
	Proxy  *proxy.Proxy
	// Events follows the backends' KV events; nil without Config.KVEvents.
	Events *follow.Follower
	// Page is the live fleet page; nil without Config.FleetPage and a
	// metrics listener.
	Page *fleetpage.Page
	// URL is the API's base URL; MetricsURL the metrics listener's, if any.
	URL, MetricsURL string

	cfg     Config
	log     *slog.Logger
	api     *http.Server
	metrics *http.Server
	hub     *peers.Hub // streams this replica's counts to its peers
	cancel  context.CancelFunc
	run     *Group
	once    sync.Once
}

// Start builds the fleet, the router and the proxy, checks every backend
// once (so that the router is ready as soon as it can be), and starts
// serving. The fleet's loops run until Shutdown or Close, or until ctx ends.
// It is long because it wires the parts in the order they depend on each
// other, each once; split, the order would hide in the calls.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	cfg = withDefaults(cfg)
	log := cfg.Logger
	// Whether every peer's counts come by push, as the poller last found.
	pushed := new(atomic.Bool)
	// The peers heard, for the lanes a burst is split by: set once the
	// poller is (a replica with no peers has none).
	id, poller := replicaID(), new(atomic.Pointer[peers.Poller])
	if cfg.Router.KVRoute.PeerPush > 0 {
		cfg.Router.KVRoute.PeersPushed = pushed.Load
		cfg.Router.KVRoute.Lanes = func() (string, []string) {
			if p := poller.Load(); p != nil {
				return id, p.Replicas()
			}
			return id, nil
		}
	}
	core, err := NewCore(ctx, CoreConfig{Backends: cfg.Backends, Discovery: cfg.Discovery, Fleet: cfg.Fleet,
		Policy: cfg.Policy, Router: cfg.Router, KVEvents: cfg.KVEvents, Logger: log})
	if err != nil {
		return nil, err
	}
	fl, rt := core.Fleet, core.Router
	cfg.Proxy.Fleet, cfg.Proxy.Router = core.ProxyFleet(), rt
	if cfg.Proxy.Logger == nil {
		cfg.Proxy.Logger = log
	}
	px, err := proxy.New(cfg.Proxy)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, &ListenError{Listener: "API", Err: err}
	}
	s := &Server{Fleet: fl, Router: rt, Proxy: px, Events: core.Events(), cfg: cfg, log: log, run: NewGroup()}
	scheme := "http"
	if cfg.MaxConns > 0 {
		ln = limitListener(ln, cfg.MaxConns)
	}
	if cfg.TLS != nil {
		ln, scheme = tls.NewListener(ln, cfg.TLS), "https"
	} else {
		ln = openAIErrors(ln, !cfg.Proxy.NetConnIO) // connerrors.go: net/http's own 400/431 answers as JSON
	}
	s.URL = scheme + "://" + ln.Addr().String()
	var mln net.Listener
	if cfg.MetricsListen != "" {
		if mln, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			ln.Close()
			return nil, &ListenError{Listener: "metrics", Err: err}
		}
		s.MetricsURL = "http://" + mln.Addr().String()
	}

	ctx, s.cancel = context.WithCancel(ctx)
	core.Run(ctx, s.goRun)
	var api, admin http.Handler = px, px.MetricsHandler()
	po := cfg.Peers
	if po.MaxAge <= 0 {
		po.MaxAge = cfg.Router.KVRoute.PeerMaxAge
	}
	if po.MaxAge <= 0 {
		po.MaxAge = kvroute.DefaultPeerMaxAge
	}
	// The stream's heartbeat is what keeps a quiet replica's counts fresh
	// at its followers: well within the age past which they stop counting.
	s.hub = peers.NewHub(id, fl.Backends, peers.HubOptions{
		Heartbeat: min(cmp.Or(po.Interval, peers.DefaultInterval), po.MaxAge/4), WriteTimeout: po.Timeout,
		Logger: log, Registerer: px.Registerer()})
	fl.WatchLoad(s.hub.Changed)
	// The counts name the backends' addresses: on the API listener only
	// when the operator asked for peers and gave no admin listener.
	if mln != nil && cfg.FleetPage {
		// Before the API serves: the page's ring observes every decision.
		gather, _ := px.Registerer().(prometheus.Gatherer)
		s.Page = fleetpage.New(fleetpage.Config{Fleet: fl, Router: rt, Gatherer: gather})
		admin = withFleetPage(admin, s.Page)
	}
	switch {
	case mln != nil:
		admin = withPeerLoad(admin, id, fl, s.hub)
	case len(cfg.Peers.Peers) > 0:
		api = withPeerLoad(api, id, fl, s.hub)
	}
	if len(cfg.Peers.Peers) > 0 {
		po.Logger, po.Registerer, po.Pushed = log, px.Registerer(), pushed
		pl := peers.NewPoller(id, fl.Backends, po)
		poller.Store(pl)
		s.goRun(func() error { return pl.Run(ctx) })
	}
	s.api = &http.Server{Handler: api, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		ReadHeaderTimeout: max(cfg.ReadHeaderTimeout, 0), IdleTimeout: max(cfg.IdleTimeout, 0)}
	s.goRun(func() error { return s.api.Serve(ln) })
	if mln != nil {
		s.metrics = &http.Server{Handler: admin, ReadHeaderTimeout: DefaultReadHeaderTimeout}
		s.goRun(func() error { return s.metrics.Serve(mln) })
	}
	return s, nil
}

// withPeerLoad serves the replica's in-flight counts at peers.Path, and
// their stream at peers.StreamPath, beside next.
func withPeerLoad(next http.Handler, id string, fl *fleet.Fleet, hub *peers.Hub) http.Handler {
	counts := peers.Handler(id, fl.Backends)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case peers.Path:
			counts.ServeHTTP(w, r)
		case peers.StreamPath:
			hub.ServeHTTP(w, r)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// withFleetPage serves the fleet page and its JSON beside next.
func withFleetPage(next http.Handler, page *fleetpage.Page) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case fleetpage.PagePath, fleetpage.JSONPath:
			page.ServeHTTP(w, r)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// replicaID names this process among router replicas: random, so that a
// replica that polls itself (a headless Service lists every pod) knows its
// own report.
func replicaID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func withDefaults(cfg Config) Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&cfg.IdleTimeout, DefaultIdleTimeout)
	def(&cfg.DrainDelay, DefaultDrainDelay)
	def(&cfg.Grace, DefaultGrace)
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// goRun runs fn in a goroutine Close waits for; an error other than a
// closed server's goes to Err.
func (s *Server) goRun(fn func() error) { s.run.Go(fn) }

// Err receives the first error a listener or the fleet's loop failed with.
func (s *Server) Err() <-chan error { return s.run.Err() }

// Shutdown drains the router and stops it, in phases, each logged:
//  1. /readyz answers 503 at once, and requests are still accepted for
//     DrainDelay, so that the load balancer in front stops sending them;
//  2. the listener closes and requests in flight get Grace to finish;
//  3. what is left is ended: streams with an error event, others with 503;
//  4. the fleet's loops and discovery stop.
//
// It returns when everything Start started has stopped, or ctx ends (then
// connections are closed at once).
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.once.Do(func() { err = s.shutdown(ctx) })
	return err
}

func (s *Server) shutdown(ctx context.Context) error {
	log := s.log
	s.Proxy.Drain()
	if d := s.cfg.DrainDelay; d > 0 {
		log.Info("draining: /readyz answers 503, still accepting requests", "for", d.String())
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
	log.Info("draining: no longer accepting; waiting for requests in flight", "grace", max(s.cfg.Grace, 0).String())
	s.hub.Close() // the peers' streams would hold the listener open until the grace ends
	graceCtx, cancel := context.WithTimeout(ctx, max(s.cfg.Grace, 0))
	err := s.api.Shutdown(graceCtx)
	cancel()
	if err != nil {
		log.Warn("draining: grace over; ending the requests still in flight")
		s.Proxy.Stop()
		// The handlers write their error events and return at once.
		endCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := s.api.Shutdown(endCtx); err != nil {
			s.api.Close()
		}
		cancel()
	}
	s.stopRest()
	log.Info("stopped")
	return nil
}

// Close stops everything at once: requests in flight are ended (streams
// with an error event) and connections closed. It waits for everything
// Start started.
func (s *Server) Close() {
	s.once.Do(func() {
		s.Proxy.Stop()
		s.hub.Close()
		s.api.Close()
		s.stopRest()
	})
}

// stopRest stops the metrics listener and the fleet's loops, and waits for
// every goroutine Start started.
func (s *Server) stopRest() {
	if s.metrics != nil {
		s.metrics.Close()
	}
	s.cancel()
	s.run.Wait()
}

// limitListener accepts at most n connections open at once; the others
// wait in the kernel's backlog (and, past it, are refused), as nginx's
// worker_connections.
func limitListener(ln net.Listener, n int) net.Listener {
	return &limited{Listener: ln, sem: make(chan struct{}, n)}
}

type limited struct {
	net.Listener
	sem chan struct{}
}

func (l *limited) Accept() (net.Conn, error) {
	l.sem <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitedConn{Conn: c, release: func() { <-l.sem }}, nil
}

type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// SyscallConn is the connection's own, so that openAIErrors still reads
// and writes it raw (internal/rawsock).
func (c *limitedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
