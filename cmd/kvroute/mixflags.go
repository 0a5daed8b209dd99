package main

import (
	"flag"
	"fmt"
	"slices"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// fleetProfiles reads --profile, one profile or a mixed fleet
// (NAME[=MODEL]:COUNT,...), with --kv-blocks and --block-size applied to
// every server. It returns the fleet's first profile, named for the whole
// fleet when mixed, each server's profile (nil when all are one), and the
// number of servers: a mixed fleet's counts set it, and --backends, when
// given too, must agree with them.
func fleetProfiles(fs *flag.FlagSet, spec string, backends, kvBlocks, blockSize int) (engine.Profile, []engine.Profile, int, error) {
	parts, err := engine.ParseFleet(spec)
	if err != nil {
		return engine.Profile{}, nil, 0, fmt.Errorf("--profile: %w", err)
	}
	if n := engine.FleetSize(parts); n > 0 {
		if flagSet(fs, "backends") && n != backends {
			return engine.Profile{}, nil, 0, fmt.Errorf("--profile %s names %d servers, --backends %d: give one, or make them agree", spec, n, backends)
		}
		backends = n
	}
	servers := engine.FleetServers(parts, backends)
	for i := range servers {
		if kvBlocks > 0 {
			servers[i].NumGPUBlocks = kvBlocks
		}
		servers[i] = servers[i].WithBlockSize(blockSize)
	}
	first := servers[0]
	if len(parts) == 1 && parts[0].Count == 0 {
		return first, nil, backends, nil
	}
	first.Name = spec
	return first, servers, backends, nil
}

// assignModels gives each session of a fleet of several models one of
// them, in proportion to the servers serving each.
func assignModels(w *workload.Workload, servers []engine.Profile, seed uint64) error {
	var models []string
	var weights []float64
	for _, p := range servers {
		i := slices.Index(models, p.Model)
		if i < 0 {
			models, weights = append(models, p.Model), append(weights, 0)
			i = len(models) - 1
		}
		weights[i]++
	}
	if len(models) < 2 {
		return nil
	}
	return workload.AssignModels(w, models, weights, seed)
}

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
