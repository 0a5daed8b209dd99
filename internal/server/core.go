package server

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/kvevents/follow"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/policies"
)

// CoreConfig describes what every router front shares: the fleet, where
// its backends come from, and the policy. Policy is required, and Backends
// or Discovery.
type CoreConfig struct {
	// Backends are the fleet (their Index fields numbering them 0..n-1).
	// With Discovery they are ignored: the fleet starts as Discovery
	// resolves it.
	Backends []*fleet.Backend
	// Discovery, when not nil, keeps the fleet current: NewCore resolves
	// it once for the initial fleet, Run runs its loop, each change
	// applied with fleet.Fleet.Update and told to the policy.
	Discovery *discovery.Discovery
	// Fleet configures health checks, scrapes and outlier ejection.
	Fleet fleet.Options
	// Policy is the routing policy's name (policies.Names); Router its
	// options (Metrics is filled in from the fleet).
	Policy string
	Router policies.Options
	// KVEvents, when not nil, follows the backends' engine KV events and
	// gives kvroute their exact cached blocks (internal/kvevents); its
	// Metrics and Log are filled in.
	KVEvents *follow.FollowConfig
	// Logger receives the fleet's and discovery's logs; nil means
	// slog.Default().
	Logger *slog.Logger
}

// Core is the fleet and the router over it, as `kvroute serve` and
// `kvroute epp` both run them.
type Core struct {
	Fleet  *fleet.Fleet
	Router *router.Router

	discovery *discovery.Discovery
	events    *follow.Follower // nil without CoreConfig.KVEvents
	metrics   *kvevents.Metrics
	log       *slog.Logger
}

// NewCore resolves the discovery (if any) and builds the fleet and the
// router, the router told of every change of the fleet before a new
// backend is a candidate. Nothing runs until Run.
func NewCore(ctx context.Context, cfg CoreConfig) (*Core, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	cfg.Fleet.Logger = log
	if cfg.Discovery != nil {
		bs, err := cfg.Discovery.Resolve(ctx)
		if err != nil {
			// A source that fails now may work later: Run keeps trying.
			log.Warn("discovery: some sources failed at start", "err", err, "backends", len(bs))
		}
		cfg.Backends = bs
	}
	fl := fleet.New(cfg.Backends, cfg.Fleet)
	cfg.Router.Metrics = fl.Metrics // for policies that read scraped load
	c := &Core{Fleet: fl, discovery: cfg.Discovery, log: log}
	c.newEvents(&cfg)
	rt, err := policies.New(cfg.Policy, cfg.Backends, cfg.Router)
	if err != nil {
		if cfg.Discovery != nil {
			cfg.Discovery.Close()
		}
		return nil, err
	}
	c.Router = rt
	// The policy (and the events' follower) grows before a new backend is
	// a candidate.
	fl.Watch(func(bs []*fleet.Backend) {
		rt.SetBackends(bs)
		if c.events != nil {
			c.events.SetBackends(bs)
		}
	})
	return c, nil
}

// newEvents makes the follower of the backends' KV events that cfg asks
// for, if any, and hands it to kvroute.
func (c *Core) newEvents(cfg *CoreConfig) {
	if cfg.KVEvents == nil {
		return
	}
	kc := *cfg.KVEvents
	if kc.Metrics == nil {
		kc.Metrics = kvevents.NewMetrics()
	}
	if kc.Log == nil {
		kc.Log = c.log
	}
	c.events, c.metrics = follow.NewFollower(kc), kc.Metrics
	cfg.Router.KVRoute.Events = c.events
}

// Events is the follower of the backends' KV events, nil without
// CoreConfig.KVEvents.
func (c *Core) Events() *follow.Follower { return c.events }

// ProxyFleet is the fleet as a proxy should see it: with the KV events'
// metrics served beside the fleet's when there are events.
func (c *Core) ProxyFleet() proxy.Fleet {
	if c.events == nil {
		return c.Fleet
	}
	return withCollector{c.Fleet, c.metrics}
}

// Discovered reports whether discovery keeps the fleet current.
func (c *Core) Discovered() bool { return c.discovery != nil }

// Run checks every backend once, then starts, with goRun, the fleet's
// health and scrape loops and the discovery's loop, all until ctx ends.
func (c *Core) Run(ctx context.Context, goRun func(func() error)) {
	c.Fleet.Refresh(ctx)
	goRun(func() error { return c.Fleet.Run(ctx) })
	if c.events != nil {
		goRun(func() error {
			c.events.Start(ctx, c.Fleet.Backends())
			<-ctx.Done()
			c.events.Wait()
			return nil
		})
	}
	if d := c.discovery; d != nil {
		goRun(func() error {
			return d.Run(ctx, func(ctx context.Context, bs []*fleet.Backend) {
				added, removed := c.Fleet.Update(ctx, bs)
				c.log.Info("fleet changed", "backends", len(c.Fleet.Backends()), "added", len(added), "removed", len(removed))
			})
		})
	}
}

// withCollector is the fleet as the proxy sees it, its metrics served
// with another component's.
type withCollector struct {
	*fleet.Fleet
	extra prometheus.Collector
}

func (w withCollector) Collector() prometheus.Collector {
	return collectors{w.Fleet.Collector(), w.extra}
}

type collectors []prometheus.Collector

func (cs collectors) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range cs {
		c.Describe(ch)
	}
}

func (cs collectors) Collect(ch chan<- prometheus.Metric) {
	for _, c := range cs {
		c.Collect(ch)
	}
}
