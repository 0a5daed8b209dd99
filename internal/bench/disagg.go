package bench

import (
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/router/policies"
)

// SplitSep separates a policy from its prefill/decode splitter in a run's
// name (kvroute@priced), as in the simulator.
const SplitSep = "@"

// roleOf is emulated backend i's part: the last Prefill of them prefill,
// the others decode; none without a prefill pool.
func (f *Fleet) roleOf(i int) emulator.Disagg {
	switch {
	case f.prefill == 0:
		return emulator.Disagg{}
	case i >= f.backends-f.prefill:
		return emulator.Disagg{Role: "prefill"}
	}
	return emulator.Disagg{Role: "decode"}
}

// disagg cuts cfg.Policy into the router's policy and the proxy's
// disaggregation config, and labels the prefill backends.
func disagg(cfg FleetConfig, backends []*fleet.Backend) (string, proxy.Disagg, error) {
	policy, split, _ := strings.Cut(cfg.Policy, SplitSep)
	if cfg.Prefill <= 0 {
		if split != "" {
			return "", proxy.Disagg{}, fmt.Errorf("splitter %q with no prefill servers", split)
		}
		return policy, proxy.Disagg{}, nil
	}
	for _, b := range backends[len(backends)-cfg.Prefill:] {
		b.SetRole(fleet.RolePrefill)
	}
	if split == "" {
		split = policies.DefaultSplitter
	}
	o := policies.SplitOptions{}
	o.Price.KVBytesPerToken = cfg.Profile.KVBytesPerToken()
	s, err := policies.NewSplitter(split, o)
	if err != nil {
		return "", proxy.Disagg{}, err
	}
	return policy, proxy.Disagg{Splitter: s}, nil
}
