package bench

import (
	"context"
	"io"
	"log/slog"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/workload"
)

// DemoConfig configures `kvroute demo`.
type DemoConfig struct {
	// Backends is the number of emulated servers (default 4).
	Backends int
	// TimeScale is wall time per model second (default 0.2).
	TimeScale float64
	// Policies are compared in order (default round-robin, kvroute).
	Policies []string
	// Workload is the chat workload (default workload.DemoChat()).
	Workload *workload.ChatConfig
	// Seed makes the run reproducible.
	Seed uint64
	// Progress receives progress bars; nil shows none.
	Progress io.Writer
	// Logger receives the components' logs; nil discards them.
	Logger *slog.Logger
}

// RunDemo runs the demo workload once per policy, each on a fresh emulated
// fleet (cold caches) with the same sessions: RunBench with the demo's
// defaults.
func RunDemo(ctx context.Context, cfg DemoConfig) (*results.Report, error) {
	if cfg.Backends <= 0 {
		cfg.Backends = 4
	}
	if cfg.TimeScale <= 0 {
		cfg.TimeScale = 0.2
	}
	if len(cfg.Policies) == 0 {
		cfg.Policies = []string{"round-robin", "kvroute"}
	}
	wl := workload.DemoChat()
	if cfg.Workload != nil {
		wl = *cfg.Workload
	}
	profile, err := engine.LookupProfile(engine.DefaultProfile)
	if err != nil {
		return nil, err
	}
	return RunBench(ctx, Config{
		Workload:  workload.Workload{Name: "chat", Sessions: workload.Chat(wl, cfg.Seed)},
		Backends:  cfg.Backends,
		Profile:   profile,
		Policies:  cfg.Policies,
		TimeScale: cfg.TimeScale,
		Seed:      cfg.Seed,
		Progress:  cfg.Progress,
		Logger:    cfg.Logger,
	})
}
