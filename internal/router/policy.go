package router

import (
	"fmt"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// Options configure the policies built by New.
type Options struct {
	// Seed seeds random choices; 0 picks a random seed.
	Seed uint64
	// KVRoute tunes the kvroute policy.
	KVRoute KVRouteConfig
	// Peers tunes the policies reimplemented from other routers.
	Peers PeerConfig
	// Metrics returns a backend's latest scraped metrics, or nil when there
	// are none or they are stale (fleet.Fleet.Metrics does both). Policies
	// that read scraped load (llmd-default; kvroute for engines with slots)
	// fall back to the router's own counts without it. Nil means no scraped
	// metrics. Must be safe for concurrent use and must not block.
	Metrics func(*fleet.Backend) *fleet.Metrics
	// Now is the policies' clock; nil means time.Now. The simulator passes
	// its virtual clock.
	Now func() time.Time
}

// Names lists the policies New knows, the default first.
func Names() []string {
	return []string{
		"kvroute", "round-robin", "least-request", "session-hash",
		"random", "p2c", "session-bounded", "sglang-cache-aware", "dynamo-kv", "llmd-default", "preble-e2",
	}
}

// New returns the policy called name for a fleet of backends.
func New(name string, backends []*fleet.Backend, opts Options) (Policy, error) {
	switch name {
	case "kvroute":
		cfg := opts.KVRoute
		if cfg.Seed == 0 {
			cfg.Seed = opts.Seed
		}
		if cfg.Now == nil {
			cfg.Now = opts.Now
		}
		if cfg.Metrics == nil {
			cfg.Metrics = opts.Metrics
		}
		return NewKVRoute(backends, cfg), nil
	case "round-robin":
		return &RoundRobin{}, nil
	case "least-request":
		return NewLeastRequest(opts.Seed), nil
	case "session-hash":
		return NewSessionHash(backends, opts.Seed), nil
	case "random":
		return NewRandom(opts.Seed), nil
	case "p2c":
		return NewP2C(opts.Seed), nil
	case "session-bounded":
		return NewSessionBounded(backends, opts), nil
	case "sglang-cache-aware":
		return NewSGLangCacheAware(opts), nil
	case "dynamo-kv":
		return NewDynamoKV(backends, opts), nil
	case "llmd-default":
		return NewLLMDDefault(backends, opts), nil
	case "preble-e2":
		return NewPrebleE2(backends, opts), nil
	}
	return nil, fmt.Errorf("unknown policy %q (have %s)", name, strings.Join(Names(), ", "))
}
