package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/progress"
	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/router/kvroute"
	"github.com/kvroute/kvroute/internal/workload"
)

// Config configures a `kvroute bench` run.
type Config struct {
	// Workload is played once per policy, identically.
	Workload workload.Workload
	// LoRA, when not nil, makes the emulated servers serve the workload's
	// LoRA adapters with these limits (lora.go).
	LoRA *engine.LoRA
	// DataParallel, above 1, makes every emulated server that many
	// data-parallel ranks behind one address, each a backend of the
	// router's: Backends counts servers.
	DataParallel int
	// Backends is the number of emulated servers; Profile their model.
	Backends int
	Profile  engine.Profile
	// Servers, when set, is each emulated server's own profile, one per
	// backend: a fleet of GPU generations serving one model.
	Servers []engine.Profile
	// BackendURLs, when set, are running servers (llama-server, vLLM, ...)
	// to play the workload against instead of emulators: Backends, Profile
	// and TimeScale are ignored, times are real. Their caches cannot be
	// emptied between policies, so each run tags its prompts (Client.Tag)
	// to start from a cold cache all the same; their KV capacity is
	// unknown, so there is no ideal-router bound.
	BackendURLs []string
	// Policies are kvroute --policy values or real balancers (balancer.Kinds()).
	Policies []string
	// TimeScale is wall seconds per model second.
	TimeScale float64
	// Users, when positive, plays the workload closed loop with that many
	// users instead of at its arrival times.
	Users int
	// Seed seeds the policies and the emulators' replies.
	Seed uint64
	// Goodput, when positive, searches each policy's highest arrival rate
	// whose p99 TTFT stays under it.
	Goodput time.Duration
	// SLO is the joint objective whose goodput the report gives per
	// policy, and which kvroute's goodput objective serves; zero: none.
	SLO results.SLO
	// Objective is kvroute's objective (empty: its default); a policy
	// named kvroute:OBJECTIVE overrides it.
	Objective kvroute.Objective
	// Sample is the interval of the per-backend load samples, in model
	// time (default 1 s).
	Sample time.Duration
	// KVEvents makes the emulators publish their KV events and the router
	// follow them (FleetConfig.KVEvents).
	KVEvents bool
	// TokenizeTimeout is FleetConfig.TokenizeTimeout.
	TokenizeTimeout time.Duration
	// Predictions reports, per policy that predicts, the share of requests
	// whose cached tokens it predicted to the block (the demo leaves it
	// out: without the engines' events the index predicts in its own
	// blocks of bytes, which a newcomer would read as a failure).
	Predictions bool
	// Faults, when set, is played against the emulated backends during
	// every run, the same for each policy. It needs open-loop arrivals and
	// the backends it names.
	Faults *FaultSchedule
	// Progress receives progress bars; nil shows none.
	Progress io.Writer
	// Logger receives the components' logs; nil discards them.
	Logger *slog.Logger
	// Prefill is FleetConfig.Prefill: how many of the Backends are
	// prefill servers; each policy is then POLICY@SPLITTER.
	Prefill int
}

// blockTokens is the block size the bounds are computed with: vLLM's.
const blockTokens = 16

// RunBench plays cfg.Workload through every policy, each on a fresh fleet with
// cold caches, and returns what it measured.
func RunBench(ctx context.Context, cfg Config) (*results.Report, error) {
	if cfg.Sample <= 0 {
		cfg.Sample = time.Second
	}
	real := len(cfg.BackendURLs) > 0
	if cfg.Faults != nil {
		switch {
		case real:
			return nil, errors.New("--faults injects faults into emulated backends; it cannot go with --backend-url")
		case cfg.Users > 0:
			return nil, errors.New("--faults places its windows along the arrivals: it needs open-loop arrivals, not --users")
		}
		if err := cfg.Faults.Validate(cfg.Backends); err != nil {
			return nil, err
		}
	}
	if real {
		cfg.Backends, cfg.TimeScale = len(cfg.BackendURLs), 1
		cfg.Profile = engine.Profile{Name: "real servers"}
		cfg.Servers = nil
	}
	if err := checkServers(cfg.Servers, cfg.Backends); err != nil {
		return nil, err
	}
	rep := &results.Report{
		Workload:           cfg.Workload.Name,
		Description:        cfg.Workload.Description,
		Backends:           cfg.Backends,
		Profile:            cfg.Profile.Name,
		KVTokensPerBackend: cfg.Profile.Blocks() * cfg.Profile.BlockSize,
		TimeScale:          cfg.TimeScale,
		Seed:               cfg.Seed,
		Created:            time.Now().UTC(),
	}
	for i, policy := range cfg.Policies {
		run, err := runOnce(ctx, cfg, policy, cfg.Workload.Sessions, i == 0)
		if err != nil {
			return rep, fmt.Errorf("%s: %w", policy, err)
		}
		if i == 0 {
			// The bounds depend on the workload and the fleet's capacity
			// only; the first run's requests carry the block hashes.
			if real {
				// Capacity unknown: only the unlimited bound holds.
				rep.Bounds = results.CacheBounds(run.Requests, blockTokens, math.MaxInt32)
				rep.Bounds.Ideal = 0
			} else {
				rep.Bounds = results.CacheBounds(run.Requests, blockTokens, cfg.Backends*cfg.Profile.Blocks())
			}
			for j := range run.Requests {
				run.Requests[j].PromptBlocks, run.Requests[j].SequenceBlocks = nil, nil
			}
		}
		if cfg.Goodput > 0 {
			g, err := searchGoodput(ctx, cfg, policy)
			if err != nil {
				return rep, fmt.Errorf("%s goodput: %w", policy, err)
			}
			run.Goodput = g
		}
		rep.Runs = append(rep.Runs, *run)
		if err := ctx.Err(); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// runOnce plays sessions through one policy on a fresh fleet.
func runOnce(ctx context.Context, cfg Config, policy string, sessions []workload.Session, recordBlocks bool) (*results.Run, error) {
	f, err := StartFleet(ctx, FleetConfig{
		BackendURLs: cfg.BackendURLs,
		Backends:    cfg.Backends, Profile: cfg.Profile, Servers: cfg.Servers, TimeScale: cfg.TimeScale,
		Policy: policy, Seed: cfg.Seed, Logger: cfg.Logger,
		KVRoute:  kvroute.Config{Objective: cfg.Objective, SLO: kvroute.SLO{TTFT: cfg.SLO.TTFT, TPOT: cfg.SLO.TPOT}},
		KVEvents: cfg.KVEvents, TokenizeTimeout: cfg.TokenizeTimeout, Prefill: cfg.Prefill,
		LoRA: cfg.LoRA, LoRAModules: loraModules(cfg), DataParallel: cfg.DataParallel,
	})
	if err != nil {
		return nil, err
	}
	defer f.Close()
	loads := f.adapterLoads()

	var done func(results.Result)
	if cfg.Progress != nil {
		bar := progress.Bar(cfg.Progress, requests(sessions), policy)
		done = func(results.Result) { bar.Add(1) }
	}
	sampler := f.sampleLoad(ctx, cfg.Sample, cfg.TimeScale)
	c := &Client{BaseURL: f.URL, Model: f.Model, TimeScale: cfg.TimeScale, Users: cfg.Users}
	if f.watch != nil {
		c.IgnoreEOS = true
		c.Tag = runTag(policy)
	}
	if recordBlocks {
		c.BlockTokens = blockTokens
	}
	if f.watch == nil && cfg.Faults != nil {
		// Every emulator gives an equal prompt an equal reply: a spliced
		// stream must be the reply any of them gives. Only under faults:
		// the check delays each conversation's next turn by a tokenization.
		c.CheckReplies, c.EmulatorSeed = true, cfg.Seed
	}
	var (
		span   time.Duration
		faults faultLog
	)
	stopFaults := func() {}
	c.Start = time.Now()
	if cfg.Faults != nil {
		if span, err = faultSpan(sessions); err != nil {
			return nil, err
		}
		c.Timeout = faultClientTimeout
		logger := cfg.Logger
		if logger == nil {
			logger = slog.New(slog.DiscardHandler)
		}
		stopFaults = driveFaults(ctx, f, cfg.Faults, c.Start, span, cfg.TimeScale, &faults, logger)
	}
	reqs := c.Run(ctx, sessions, done)
	stopFaults()
	if cfg.Faults != nil {
		markFaults(cfg.Faults, span, reqs)
		markMigrated(faults, f.Names, reqs)
	}
	series := sampler.stop()
	run := &results.Run{Policy: policy, Requests: reqs, Backends: series}
	run.Summary = results.Summarize(policy, reqs)
	if c.CheckReplies {
		for _, r := range reqs {
			if r.Err == nil {
				run.Summary.TextChecked++
			}
		}
	}
	run.Summary.RouterMigrations = f.migrations()
	run.Summary.ApplySLO(reqs, cfg.SLO)
	if cfg.Predictions && f.watch == nil && slices.ContainsFunc(reqs, func(r results.Result) bool { return r.PredictedCached > 0 }) {
		// The router told its predictions (proxy.Config.Explain), and the
		// emulators' block size is known.
		run.Summary.PredictionAccuracy = results.PredictionAccuracy(reqs, cfg.Profile.BlockSize)
	}
	busy := make([]time.Duration, len(series))
	for i, s := range series {
		busy[i] = s.Busy
	}
	run.Summary.Imbalance = results.Imbalance(busy)
	run.Summary.AdapterLoads = f.adapterLoads() - loads
	return run, nil
}

func requests(sessions []workload.Session) int {
	n := 0
	for _, s := range sessions {
		n += len(s.Turns)
	}
	return n
}

// runTag returns a tag that no earlier run, in this process or another,
// has sent: the policy, for people reading server logs, and a nonce.
func runTag(policy string) string {
	return fmt.Sprintf("[bench run %s %x] ", policy, runNonce.Add(1)^uint64(time.Now().UnixNano()))
}

var runNonce atomic.Uint64

// backendStats is a backend's state and cumulative counters at one moment.
type backendStats struct {
	running, waiting int
	kvUsage          float64
	// busy is compute time in model time; prompt and cached count prompt
	// tokens, all since the backend started.
	busy           time.Duration
	prompt, cached int64
	// loraLoads counts LoRA adapters loaded from storage.
	loraLoads int64
}

// stats reads every backend's state: the emulators' own, or what real
// backends' /metrics (and llama-server's /slots) say. A real backend that
// does not answer keeps its previous reading (prev, which may be nil).
func (f *Fleet) stats(ctx context.Context, prev []backendStats) []backendStats {
	out := make([]backendStats, len(f.Names))
	if f.watch == nil {
		f.mu.Lock()
		defer f.mu.Unlock()
		for i, srv := range f.Servers {
			st := srv.Stats()
			// A restarted backend's counters start again from zero: add
			// those of the servers it replaced.
			r := f.retired[i]
			out[i] = backendStats{running: st.Running, waiting: st.Waiting, kvUsage: st.KVUsage,
				busy: r.busy + st.BusyTime, prompt: r.prompt + st.PrefixQueries, cached: r.cached + st.PrefixHits}
			if f.emu[i].srv == nil {
				// Killed: a dead server runs nothing and holds no cache.
				out[i].running, out[i].waiting, out[i].kvUsage = 0, 0, 0
			}
		}
		return out
	}
	f.watch.Refresh(ctx)
	for i, b := range f.watch.Backends() {
		m := f.watch.Metrics(b)
		if m == nil {
			if prev != nil {
				out[i] = prev[i]
			}
			continue
		}
		out[i] = backendStats{running: int(m.Running), waiting: int(m.Waiting), kvUsage: m.KVUsage,
			busy:   time.Duration(m.BusySeconds * float64(time.Second)),
			prompt: int64(m.PrefixQueries), cached: int64(m.PrefixHits)}
	}
	return out
}

// loadSampler records every backend's load at regular intervals.
type loadSampler struct {
	f      *Fleet
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	series []results.BackendSeries
	// first and last are the readings at the start and the latest; the
	// totals are their difference, since real backends did not start with
	// this run.
	first, last []backendStats
}

// sampleLoad starts sampling the fleet's backends every interval of model
// time.
func (f *Fleet) sampleLoad(ctx context.Context, interval time.Duration, scale float64) *loadSampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &loadSampler{f: f, cancel: cancel, series: make([]results.BackendSeries, len(f.Names))}
	for i := range s.series {
		s.series[i].Name = f.Names[i]
	}
	s.first = f.stats(ctx, nil)
	s.last = s.first
	start := time.Now()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(time.Duration(math.Max(float64(interval)*scale, float64(10*time.Millisecond))))
		defer t.Stop()
		for {
			s.take(ctx, time.Duration(float64(time.Since(start))/scale))
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *loadSampler) take(ctx context.Context, at time.Duration) {
	s.mu.Lock()
	last := s.last
	s.mu.Unlock()
	st := s.f.stats(ctx, last) // without the lock: a real backend may take a while
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = st
	for i, b := range st {
		s.series[i].Samples = append(s.series[i].Samples, results.LoadSample{At: at, Running: b.running, Waiting: b.waiting, KVUsage: b.kvUsage})
	}
}

// stop ends sampling and returns the series with the backends' totals for
// the run.
func (s *loadSampler) stop() []results.BackendSeries {
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	end := s.f.stats(context.Background(), s.last)
	for i, e := range end {
		s.series[i].Busy = e.busy - s.first[i].busy
		s.series[i].PromptTokens = e.prompt - s.first[i].prompt
		s.series[i].CachedTokens = e.cached - s.first[i].cached
	}
	return s.series
}

// searchGoodput finds the highest arrival rate (the workload's arrivals
// sped up or slowed down) at which the policy's p99 TTFT stays under
// cfg.Goodput: doubling the rate from half the workload's until the SLO
// breaks, then bisecting twice.
func searchGoodput(ctx context.Context, cfg Config, policy string) (*results.Goodput, error) {
	sessions := cfg.Workload.Sessions
	last := sessions[len(sessions)-1].Start
	if last <= 0 || cfg.Users > 0 {
		return nil, fmt.Errorf("goodput needs an open-loop workload with arrival times")
	}
	base := float64(len(sessions)) / last.Seconds() // sessions per second
	g := &results.Goodput{SLO: cfg.Goodput}
	trial := func(speed float64) (bool, error) {
		scaled := make([]workload.Session, len(sessions))
		copy(scaled, sessions)
		for i := range scaled {
			scaled[i].Start = time.Duration(float64(scaled[i].Start) / speed)
		}
		quiet := cfg
		quiet.Progress = nil
		run, err := runOnce(ctx, quiet, policy, scaled, false)
		if err != nil {
			return false, err
		}
		s := run.Summary
		met := s.Errors == 0 && s.TTFTP99 <= cfg.Goodput
		g.Points = append(g.Points, results.GoodputPoint{Rate: base * speed, TTFTP99: s.TTFTP99, Errors: s.Errors, Met: met})
		if met {
			g.Rate = math.Max(g.Rate, base*speed)
		}
		return met, ctx.Err()
	}
	// Double from half the workload's own rate until the SLO breaks; if it
	// breaks even there, report no goodput rather than crawl down to rates
	// that take ever longer to replay.
	lo, hi := 0.0, 0.0
	for speed := 0.5; speed <= 64; speed *= 2 {
		met, err := trial(speed)
		if err != nil {
			return g, err
		}
		if !met {
			hi = speed
			break
		}
		lo = speed
	}
	if hi == 0 || lo == 0 {
		return g, nil // met even at 64×, or not even at half the rate
	}
	for range 2 {
		mid := (lo + hi) / 2
		met, err := trial(mid)
		if err != nil {
			return g, err
		}
		if met {
			lo = mid
		} else {
			hi = mid
		}
	}
	return g, nil
}
