// Package sim is the fleet simulator (`kvroute sim`): a discrete-event
// simulation, in virtual time, of a fleet of inference servers and of the
// router replicas in front of them, replaying the workloads of `kvroute
// bench`.
//
// Every server is an unchanged engine.Engine, the model the emulator serves;
// every router replica is an unchanged router.Router, driven the way the
// proxy drives it: Route for a ticket, Ticket.FirstToken at the first token,
// Ticket.Finish at the end. Only the clock differs:
// instead of sleeping for a step's modelled duration, the simulator jumps to
// the moment the next thing happens. So what it says about a policy at a
// scale no machine here can emulate is about that policy's code.
//
// See docs/simulator.md for the event model and what is not modelled.
package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/internal/progress"
	"github.com/kvroute/kvroute/internal/results"
)

// Run plays cfg.Workload through every policy, each on a fresh fleet with
// cold caches, and returns the same report `kvroute bench` writes.
func Run(ctx context.Context, cfg Config) (*results.Report, error) {
	rep, _, err := RunStats(ctx, cfg)
	return rep, err
}

// RunStats is Run, also returning each run's simulator statistics.
func RunStats(ctx context.Context, cfg Config) (*results.Report, []Stats, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, nil, err
	}
	rep := &results.Report{
		Workload:           cfg.Workload.Name,
		Description:        cfg.Workload.Description,
		Backends:           cfg.Backends,
		Profile:            cfg.Profile.Name,
		KVTokensPerBackend: cfg.Profile.Blocks() * cfg.Profile.BlockSize,
		Seed:               cfg.Seed,
		Created:            time.Now().UTC(),
		Simulated:          true,
		Routers:            cfg.Routers,
	}
	if cfg.Tile > 1 {
		rep.Description = fmt.Sprintf("%s, tiled %d× (%d requests)", rep.Description, cfg.Tile, cfg.Tile*cfg.Workload.Requests())
	}
	var stats []Stats
	for i, policy := range cfg.Policies {
		withBounds := i == 0 && cfg.BoundsLimit > 0 && cfg.Tile*cfg.Workload.Requests() <= cfg.BoundsLimit
		run, st, err := simulate(ctx, cfg, policy, withBounds)
		if err != nil {
			return rep, stats, fmt.Errorf("%s: %w", policy, err)
		}
		if withBounds {
			rep.Bounds = results.CacheBounds(run.Requests, cfg.Profile.BlockSize, cfg.Backends*cfg.Profile.Blocks())
			for j := range run.Requests {
				run.Requests[j].PromptBlocks, run.Requests[j].SequenceBlocks = nil, nil
			}
		}
		run.Requests = sampleResults(run.Requests, cfg.KeepRequests) // after the bounds, which kept all
		rep.Runs = append(rep.Runs, *run)
		stats = append(stats, st)
	}
	return rep, stats, nil
}

// Stats describe the simulator's own work in one run.
type Stats struct {
	// Events is the number of events processed; Steps the engine steps.
	Events, Steps int64
	// Virtual is the virtual time simulated; Wall the time it took.
	Virtual, Wall time.Duration
}

// simulate plays the workload through one policy on a fresh fleet.
func simulate(ctx context.Context, cfg Config, policy string, withBounds bool) (*results.Run, Stats, error) {
	s, err := newSimulation(cfg, policy, withBounds)
	if err != nil {
		return nil, Stats{}, err
	}
	if cfg.Progress != nil {
		bar := progress.Bar(cfg.Progress, cfg.Tile*cfg.Workload.Requests(), policy)
		s.progress = func() { bar.Add(1) }
		defer bar.Finish()
	}
	start := time.Now()
	if err := s.run(ctx); err != nil {
		return nil, Stats{}, err
	}
	st := Stats{Events: s.events, Virtual: s.now, Wall: time.Since(start)}
	for i := range s.servers {
		st.Steps += s.servers[i].eng.Stats().Steps
	}
	return s.report(policy), st, nil
}
