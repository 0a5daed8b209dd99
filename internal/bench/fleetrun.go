package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/router"
)

// FleetConfig describes an emulated fleet behind a kvroute router, all in
// this process on loopback.
type FleetConfig struct {
	// Backends is the number of emulated servers.
	Backends int
	// Profile is their engine profile.
	Profile engine.Profile
	// TimeScale is wall time per model second (0.1 = ten times faster).
	TimeScale float64
	// Policy is the router's --policy, or a real balancer (Balancers())
	// to put in front of the backends instead of kvroute.
	Policy string
	// Seed seeds the policy and the emulators.
	Seed uint64
	// Logger receives the components' logs; nil discards them.
	Logger *slog.Logger
}

// Fleet is a running emulated fleet and its router.
type Fleet struct {
	// URL is the router's base URL.
	URL string
	// Model is the model the backends serve.
	Model string
	// Servers are the emulated backends; Names their names.
	Servers []*emulator.Server
	Names   []string

	cancel   context.CancelFunc
	servers  []*http.Server
	balancer *Balancer // when a real balancer fronts the fleet
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
	f := &Fleet{cancel: cancel}
	fail := func(err error) (*Fleet, error) {
		f.Close()
		return nil, err
	}
	var (
		backends []*fleet.Backend
		urls     []string
	)
	for i := range cfg.Backends {
		s, err := emulator.New(emulator.Config{Profile: cfg.Profile, TimeScale: cfg.TimeScale, Seed: cfg.Seed, Logger: logger})
		if err != nil {
			return fail(err)
		}
		f.Model = s.Model()
		u, err := f.serve(s)
		if err != nil {
			return fail(err)
		}
		go s.Run(ctx)
		f.Servers = append(f.Servers, s)
		f.Names = append(f.Names, fmt.Sprintf("gpu%d", i))
		backends = append(backends, fleet.NewBackend(i, f.Names[i], u))
		urls = append(urls, u.String())
	}
	if IsBalancer(cfg.Policy) {
		// A real balancer in front instead of kvroute.
		b, err := StartBalancer(ctx, cfg.Policy, urls, logger)
		if err != nil {
			return fail(err)
		}
		f.balancer, f.URL = b, b.URL
		return f, nil
	}
	fl := fleet.New(backends, fleet.Options{Logger: logger})
	fl.Refresh(ctx)
	if !fl.Ready() {
		return fail(errors.New("the emulated backends did not come up"))
	}
	go fl.Run(ctx)
	policy, err := router.New(cfg.Policy, backends, router.Options{Seed: cfg.Seed, Metrics: fl.Metrics})
	if err != nil {
		return fail(err)
	}
	px, err := proxy.New(proxy.Config{Fleet: fl, Policy: policy, Logger: logger})
	if err != nil {
		return fail(err)
	}
	u, err := f.serve(px)
	if err != nil {
		return fail(err)
	}
	f.URL = u.String()
	return f, nil
}

// serve starts h on a fresh loopback port.
func (f *Fleet) serve(h http.Handler) (*url.URL, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	f.servers = append(f.servers, srv)
	go srv.Serve(ln)
	return url.Parse("http://" + ln.Addr().String())
}

// Close stops the router (or balancer) and the backends.
func (f *Fleet) Close() {
	if f.balancer != nil {
		f.balancer.Close()
	}
	f.cancel()
	for _, s := range f.servers {
		s.Close()
	}
}

// IsBalancer reports whether name is one of Balancers().
func IsBalancer(name string) bool {
	for _, b := range Balancers() {
		if b == name {
			return true
		}
	}
	return false
}
