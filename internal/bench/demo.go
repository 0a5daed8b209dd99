package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/schollz/progressbar/v3"

	"github.com/kvroute/kvroute/internal/engine"
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
// fleet (cold caches) with the same sessions, and returns one summary per
// policy.
func RunDemo(ctx context.Context, cfg DemoConfig) ([]Summary, error) {
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
	sessions := workload.Chat(wl, cfg.Seed)
	total := 0
	for _, s := range sessions {
		total += len(s.Turns)
	}
	var sums []Summary
	for _, policy := range cfg.Policies {
		f, err := StartFleet(ctx, FleetConfig{
			Backends: cfg.Backends, Profile: profile, TimeScale: cfg.TimeScale,
			Policy: policy, Seed: cfg.Seed, Logger: cfg.Logger,
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", policy, err)
		}
		var done func(Result)
		if cfg.Progress != nil {
			bar := progressbar.NewOptions(total,
				progressbar.OptionSetWriter(cfg.Progress),
				progressbar.OptionSetDescription(fmt.Sprintf("%-14s", policy)),
				progressbar.OptionShowCount(),
				progressbar.OptionSetWidth(30),
				progressbar.OptionThrottle(100_000_000),
				progressbar.OptionOnCompletion(func() { fmt.Fprintln(cfg.Progress) }),
			)
			done = func(Result) { bar.Add(1) }
		}
		c := &Client{BaseURL: f.URL, Model: f.Model, TimeScale: cfg.TimeScale}
		results := c.Run(ctx, sessions, done)
		s := Summarize(policy, results)
		s.Imbalance = Imbalance(f.BusyTimes())
		f.Close()
		sums = append(sums, s)
		if err := ctx.Err(); err != nil {
			return sums, err
		}
	}
	return sums, nil
}
