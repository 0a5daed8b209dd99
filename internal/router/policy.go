package router

import (
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/internal/fleet"
)

// Options configure the policies built by New.
type Options struct {
	// Seed seeds random choices; 0 picks a random seed.
	Seed uint64
	// KVRoute tunes the kvroute policy.
	KVRoute KVRouteConfig
}

// Names lists the policies New knows, the default first.
func Names() []string {
	return []string{"kvroute", "round-robin", "least-request", "session-hash"}
}

// New returns the policy called name for a fleet of backends.
func New(name string, backends []*fleet.Backend, opts Options) (Policy, error) {
	switch name {
	case "kvroute":
		cfg := opts.KVRoute
		if cfg.Seed == 0 {
			cfg.Seed = opts.Seed
		}
		return NewKVRoute(backends, cfg), nil
	case "round-robin":
		return &RoundRobin{}, nil
	case "least-request":
		return NewLeastRequest(opts.Seed), nil
	case "session-hash":
		return NewSessionHash(backends, opts.Seed), nil
	}
	return nil, fmt.Errorf("unknown policy %q (have %s)", name, strings.Join(Names(), ", "))
}
