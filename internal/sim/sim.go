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
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/progress"
	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/kvroute"
	"github.com/kvroute/kvroute/internal/router/policies"
	"github.com/kvroute/kvroute/internal/workload"
)

// Config configures a simulation. Times are virtual (model) time.
type Config struct {
	// Workload is played once per policy, identically.
	Workload workload.Workload
	// Backends is the number of servers; Profile their engine profile.
	Backends int
	Profile  engine.Profile
	// Routers is the number of router replicas (default 1). Each request
	// goes to one of them uniformly at random, as behind an L4 balancer;
	// each has its own policy instance, prefix index and in-flight counts.
	Routers int
	// Policies are router policy names (policies.Names()).
	Policies []string
	// Users, when positive, plays the workload closed loop with that many
	// users instead of at its arrival times.
	Users int
	// Seed seeds the policies, the replies and the router split; the
	// first replica's policy gets Seed itself, as `kvroute bench` gives it.
	Seed uint64
	// Sample is the interval of the per-backend load samples (default 1 s).
	Sample time.Duration
	// Scrape is how often each replica reads every server's metrics
	// (default 1 s, as `kvroute serve`); metrics older than 3 scrapes are
	// stale, as in fleet.Fleet.
	Scrape time.Duration
	// Text renders every prompt as text and tokenizes it, as the live bench
	// and the emulator do, even for trace workloads that describe prompts
	// by block ids. Without it such workloads run in token mode: block
	// hashes straight from the ids, no text (see docs/simulator.md).
	Text bool
	// Tile replays the workload this many times at once (default 1), each
	// copy with its own sessions and block ids: a bigger fleet's traffic
	// from one trace. Token mode only.
	Tile int
	// KeepRequests bounds the per-request results kept in each Run (an
	// evenly spaced sample beyond it; the summary counts them all, in memory
	// that does not grow with them: results.Summarizer). Zero means 100,000;
	// negative keeps all.
	KeepRequests int
	// BoundsLimit is the largest workload, in requests, for which the cache
	// bounds are computed (they need every block of the run in memory).
	// Zero means 20,000; negative never.
	BoundsLimit int
	// Progress receives a progress bar per policy; nil shows none.
	Progress io.Writer
	// ReplicaUnaware leaves kvroute's replicas unaware of each other
	// (kvroute.Config.Replicas unset), to measure what awareness
	// saves.
	ReplicaUnaware bool
	// Gossip is how often the replicas share their in-flight counts with
	// each other, as `kvroute serve --peer` polls every --peer-interval
	// (0: never; each scales its own counts by Routers). A replica's view
	// of the others is as old as the last round.
	Gossip time.Duration
	// GossipEachRequest shares the replicas' in-flight counts before every
	// routing decision as well: each replica then knows what the others
	// have sent at the moment it routes, as one router does. No poll
	// reaches that (a round of polls takes a network round trip, and a
	// burst of requests arriving together is routed before any); it is
	// the bound that separates what the replicas' placement loses to
	// stale counts from what it loses by itself (docs/BENCHMARKS.md,
	// Router replicas). kvroute is told (kvroute.Config.PeersExact), and
	// with KVEvents decides as one router.
	GossipEachRequest bool
	// GossipPush streams each replica's in-flight counts to the others
	// whenever they change (a request routed, its first token, its end),
	// reaching them this long after (a one-way network delay; 0: never),
	// as a replica that pushes its counts to its peers would. With it the
	// others' counts are never more than this old; a burst arriving at one
	// instant is still routed before any count reaches the others.
	// kvroute is told the push delay (kvroute.Config.PeerPush), so that
	// with KVEvents it decides as one router but in a burst (then as a
	// replica keeping to its lane of the servers, inLane), unless
	// PushAsReplica: then it decides as a replica behind polled counts
	// does (internal/router/kvroute/replicas.go). Measured both ways in docs/BENCHMARKS.md
	// (Router replicas, pushed counts): on Mooncake's trace with its
	// arrivals spread over their ticks, as one router matches one
	// router's tails where the replica's end-to-end p99 is up to a third
	// longer; on its ticks replayed as instant bursts, as one router herds.
	GossipPush    time.Duration
	PushAsReplica bool
	// KVEvents makes every server publish its KV events (vLLM's
	// BlockStored and BlockRemoved) and every replica's kvroute read them,
	// KVEventDelay after the step that made them ends (default
	// DefaultKVEventDelay; see kvevents.go).
	KVEvents     bool
	KVEventDelay time.Duration
	// SLO is the joint service-level objective whose goodput the report
	// gives per policy, and which kvroute's goodput objective serves; zero
	// means none.
	SLO results.SLO
	// Objective is kvroute's objective (kvroute.Config.Objective);
	// empty means its default. A policy named kvroute:OBJECTIVE overrides it.
	Objective kvroute.Objective
	// FullScan makes kvroute score every server on every pick instead of
	// the few that can win (kvroute.Config.FullScan), to measure
	// what pruning changes.
	FullScan bool

	stepwise bool // step every step (tests check that coasting changes nothing)
}

// Stats describe the simulator's own work in one run.
type Stats struct {
	// Events is the number of events processed; Steps the engine steps.
	Events, Steps int64
	// Virtual is the virtual time simulated; Wall the time it took.
	Virtual, Wall time.Duration
}

func (c Config) withDefaults() (Config, error) {
	if c.Routers <= 0 {
		c.Routers = 1
	}
	if c.Sample <= 0 {
		c.Sample = time.Second
	}
	if c.Scrape <= 0 {
		c.Scrape = time.Second
	}
	if c.Tile <= 0 {
		c.Tile = 1
	}
	if c.KVEventDelay <= 0 {
		c.KVEventDelay = DefaultKVEventDelay
	}
	if c.KeepRequests == 0 {
		c.KeepRequests = 100_000
	}
	if c.BoundsLimit == 0 {
		c.BoundsLimit = 20_000
	}
	switch {
	case c.Backends < 1:
		return c, fmt.Errorf("sim: %d backends: need at least 1", c.Backends)
	case len(c.Workload.Sessions) == 0:
		return c, errors.New("sim: the workload has no sessions")
	case c.Profile.BlockSize <= 0:
		return c, errors.New("sim: no engine profile")
	case c.Tile > 1 && !tokenMode(c):
		return c, errors.New("sim: tiling needs a workload of single-turn, block-described requests (a trace or mixed) without --text")
	}
	return c, nil
}

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

// sampleResults keeps at most keep results, evenly spaced, in order.
func sampleResults(rs []results.Result, keep int) []results.Result {
	if keep < 0 || len(rs) <= keep {
		return rs
	}
	out := make([]results.Result, keep)
	for i := range out {
		out[i] = rs[i*len(rs)/keep]
	}
	return out
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

// server is one simulated inference server.
type server struct {
	eng *engine.Engine
	// stepping is set while a step is queued or in flight; res is the step
	// in flight, whose effects the engine has applied and whose tokens
	// reach the clients at res.End. coasting is set instead when what is in
	// flight is a run of silent decode steps (engine.Engine.Coast); end is
	// the sequence number of the event that ends either.
	stepping bool
	coasting bool
	res      engine.StepResult
	end      uint64
	samples  []results.LoadSample
}

// replica is one router replica: a router (policy instance) with its own
// view of the servers (its own fleet.Backend objects, so its own in-flight
// counts) and its own copy of their scraped metrics.
type replica struct {
	router      *router.Router
	backends    []*fleet.Backend
	metrics     []fleet.Metrics
	scraped     []time.Duration // virtual time of each server's last scrape
	scrapedOnce bool
}

// session is the state of one session being played.
type session struct {
	base int32 // index in the workload
	tile int32
	turn int32
	conv *convo // text mode
}

// simulation is one policy's run.
type simulation struct {
	cfg      Config
	text     bool
	bounds   bool
	q        queue
	now      time.Duration
	servers  []server
	replicas []*replica
	split    *rand.Rand // the L4 balancer in front of the replicas

	order *order // sessions by start time
	// sessions are the sessions started and not ended, in slots reused
	// once they end (idle lists them): a run keeps the sessions in play,
	// not every session of a ten-million-request workload.
	sessions []session
	idle     []int32
	flights  []*flight
	free     []int32
	active   int // sessions started and not ended

	// sum summarises every result as it ends; kept are those the report
	// lists: all of them (keepAll), or every stride-th.
	sum      results.Summarizer
	kept     []results.Result
	keepAll  bool
	stride   int
	recorded int
	// sampleEvery is the interval of the load samples, doubled (and the
	// samples so far thinned) whenever a server has sampleCap of them.
	sampleEvery time.Duration
	sampleCap   int
	events      int64
	stepwise    bool
	progress    func()
	origin      time.Time
	tokBuf      []int32
	salted      []uint64 // tokenHashes' scratch
	kv          *kvFeed  // the servers' KV events; nil without Config.KVEvents
	push        *pushFeed
}

// sessionRef is one session of the (tiled) workload.
type sessionRef struct {
	start time.Duration
	base  int32
	tile  int32
}

func newSimulation(cfg Config, policy string, withBounds bool) (*simulation, error) {
	s := &simulation{
		cfg:      cfg,
		text:     !tokenMode(cfg),
		bounds:   withBounds,
		stepwise: cfg.stepwise,
		split:    rand.New(rand.NewPCG(cfg.Seed, 0x73706c6974)),
		origin:   time.Unix(0, 0),
	}
	info := &fleet.Info{Models: []string{cfg.Profile.Model}, BlockSize: cfg.Profile.BlockSize, KVBlocks: cfg.Profile.Blocks()}
	s.servers = make([]server, cfg.Backends)
	for i := range s.servers {
		e, err := engine.New(cfg.Profile)
		if err != nil {
			return nil, err
		}
		s.servers[i].eng = e
	}
	if cfg.KVEvents {
		s.kv = newKVFeed(s)
	}
	for r := range cfg.Routers {
		rep := &replica{
			metrics: make([]fleet.Metrics, cfg.Backends),
			scraped: make([]time.Duration, cfg.Backends),
		}
		for i := range cfg.Backends {
			b := fleet.NewBackend(i, fmt.Sprintf("gpu%d", i), nil)
			b.SetInfo(info)
			rep.backends = append(rep.backends, b)
		}
		opts := policies.Options{
			Seed:    cfg.Seed + uint64(r)*0x9e3779b97f4a7c15,
			Metrics: s.metricsFunc(rep),
			Now:     s.clock,
		}
		opts.KVRoute.FullScan = cfg.FullScan
		opts.KVRoute.NoScores = true // no result reads them
		if !cfg.ReplicaUnaware {
			opts.KVRoute.Replicas = cfg.Routers
		}
		if cfg.Gossip > 0 {
			opts.KVRoute.PeerMaxAge = 3 * cfg.Gossip
		}
		if cfg.GossipPush > 0 {
			// A pushed count holds until the next change, however old.
			opts.KVRoute.PeerMaxAge = math.MaxInt64
		}
		opts.KVRoute.PeersExact = cfg.GossipEachRequest
		if !cfg.PushAsReplica {
			opts.KVRoute.PeerPush = cfg.GossipPush
		}
		if s.kv != nil {
			opts.KVRoute.Events = s.kv
		}
		if cfg.Routers > 1 {
			// Every replica hears every other's name from the start, as a
			// replica of kvroute serve does once it follows its peers'
			// streams (peers.Poller.Replicas): the lanes a burst is split
			// by behind pushed counts.
			self, others := replicaName(r), []string{}
			for o := range cfg.Routers {
				if o != r {
					others = append(others, replicaName(o))
				}
			}
			opts.KVRoute.Lanes = func() (string, []string) { return self, others }
		}
		opts.KVRoute.SLO = kvroute.SLO{TTFT: cfg.SLO.TTFT, TPOT: cfg.SLO.TPOT}
		opts.KVRoute.Objective = cfg.Objective
		// kvroute's prefix index need not be finer than the servers'
		// blocks, nor than a trace's (prompts that share part of a trace
		// block share all of it): a finer one only spends more work to say
		// the same.
		if b := max(cfg.Profile.BlockSize, traceBlock(cfg)) * router.TokenBytes; b > prefix.DefaultBlockBytes {
			opts.KVRoute.BlockBytes = b
		}
		r, err := policies.New(policy, rep.backends, opts)
		if err != nil {
			return nil, err
		}
		rep.router = r
		s.replicas = append(s.replicas, rep)
	}
	if cfg.GossipPush > 0 && cfg.Routers > 1 {
		s.push = newPushFeed(s)
	}
	s.order = newOrder(cfg)
	total := cfg.Tile * cfg.Workload.Requests()
	s.keepAll = withBounds || cfg.KeepRequests < 0 || total <= cfg.KeepRequests
	s.stride = 1
	if !s.keepAll {
		s.stride = (total + cfg.KeepRequests - 1) / cfg.KeepRequests
	}
	if cfg.KeepRequests > 0 {
		// At their final size: grown by append, a hundred thousand results
		// are copied several times over.
		s.kept = make([]results.Result, 0, min(total, cfg.KeepRequests)+1)
	}
	// Every result is summarised as it ends, the kept ones and the rest:
	// the report's prediction accuracy and goodput are over all of them.
	s.sum.BlockSize, s.sum.SLO = cfg.Profile.BlockSize, cfg.SLO
	s.sampleEvery = cfg.Sample
	s.sampleCap = max(minSamples, sampleBudget/cfg.Backends) &^ 1 // even: see sample
	return s, nil
}

// traceBlock returns the tokens of a block-described workload's blocks in
// token mode, when every turn has the same and it is a whole number of the
// servers' blocks; else 0.
func traceBlock(cfg Config) int {
	if !tokenMode(cfg) {
		return 0
	}
	n := cfg.Workload.Sessions[0].Turns[0].BlockTokens
	for i := range cfg.Workload.Sessions {
		if cfg.Workload.Sessions[i].Turns[0].BlockTokens != n {
			return 0
		}
	}
	if n <= 0 || n%cfg.Profile.BlockSize != 0 {
		return 0
	}
	return n
}

// clock is the policies' clock: virtual time, as a time.Time.
func (s *simulation) clock() time.Time { return s.origin.Add(s.now) }

// metricsFunc is a replica's policies.Options.Metrics: the last scrape of a
// server, or nil when it is older than three scrape intervals.
func (s *simulation) metricsFunc(rep *replica) func(*fleet.Backend) *fleet.Metrics {
	return func(b *fleet.Backend) *fleet.Metrics {
		if !rep.scrapedOnce || b.Index < 0 || b.Index >= len(rep.metrics) || s.now-rep.scraped[b.Index] > 3*s.cfg.Scrape {
			return nil
		}
		return &rep.metrics[b.Index]
	}
}

// run processes events until every session has ended.
func (s *simulation) run(ctx context.Context) error {
	if s.cfg.Users > 0 {
		for range min(s.cfg.Users, s.order.total) {
			s.startNext(0)
		}
	} else {
		s.q.push(s.order.peek().start, evSession, 0)
	}
	for r := range s.replicas {
		// Replicas scrape at staggered phases, as independent processes do.
		s.q.push(s.cfg.Scrape*time.Duration(r)/time.Duration(len(s.replicas)), evScrape, int32(r))
	}
	s.q.push(0, evSample, 0)
	if s.cfg.Gossip > 0 && len(s.replicas) > 1 {
		s.q.push(s.cfg.Gossip, evGossip, 0)
	}
	for s.q.len() > 0 {
		if s.events&0xffff == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		ev := s.q.pop()
		s.events++
		s.now = ev.at
		switch ev.kind {
		case evSession:
			s.startNext(s.now)
			if s.order.left() {
				s.q.push(s.order.peek().start, evSession, 0)
			}
		case evSend:
			s.send(int(ev.idx))
		case evStepStart:
			s.step(int(ev.idx))
		case evStepEnd:
			if ev.seq == s.servers[ev.idx].end {
				s.endStep(int(ev.idx))
			}
		case evScrape:
			s.scrape(int(ev.idx))
			if !s.done() {
				s.q.push(s.now+s.cfg.Scrape, evScrape, ev.idx)
			}
		case evGossip:
			s.gossip()
			if !s.done() {
				s.q.push(s.now+s.cfg.Gossip, evGossip, 0)
			}
		case evSample:
			s.sample()
			if !s.done() {
				s.q.push(s.now+s.sampleEvery, evSample, 0)
			}
		case evKVEvents:
			s.kv.deliver(int(ev.idx))
		case evPush:
			s.push.deliver()
		}
	}
	return nil
}

// done reports whether nothing is left to happen but the periodic events.
func (s *simulation) done() bool {
	return !s.order.left() && s.active == 0
}

// startNext starts the next session of the workload at now (its first turn
// after its think time).
func (s *simulation) startNext(now time.Duration) {
	if !s.order.left() {
		return
	}
	ref := s.order.pop()
	i := len(s.sessions)
	if n := len(s.idle); n > 0 {
		i = int(s.idle[n-1])
		s.idle = s.idle[:n-1]
	} else {
		s.sessions = append(s.sessions, session{})
	}
	s.sessions[i] = session{base: ref.base, tile: ref.tile}
	if s.text {
		s.sessions[i].conv = newConvo(&s.cfg.Workload.Sessions[ref.base])
	}
	s.active++
	s.q.push(now+s.turnOf(i).Think, evSend, int32(i))
}

// turnOf returns the current turn of session i.
func (s *simulation) turnOf(i int) *workload.Turn {
	ss := &s.sessions[i]
	return &s.cfg.Workload.Sessions[ss.base].Turns[ss.turn]
}

// endSession ends session i at now; closed loop, its user starts another.
func (s *simulation) endSession(i int) {
	s.sessions[i].conv = nil
	s.idle = append(s.idle, int32(i))
	s.active--
	if s.cfg.Users > 0 {
		s.startNext(s.now)
	}
}

// step starts a step on idle server i, or a run of silent decode steps, or
// leaves it idle if nothing can be scheduled.
func (s *simulation) step(i int) {
	sv := &s.servers[i]
	if !s.stepwise {
		if end := sv.eng.Coast(s.now, math.MaxInt); end > s.now {
			sv.coasting = true
			sv.end = s.q.push(end, evStepEnd, int32(i))
			return
		}
	}
	if s.kv != nil {
		s.kv.stepping = i
	}
	res := sv.eng.Step(s.now)
	if s.kv != nil {
		s.kv.stepped(i, max(res.End, s.now))
	}
	if res.End <= res.Start {
		// Nothing could be scheduled (no work, or waiting for KV that only
		// a departure frees): the next arrival wakes it.
		sv.stepping = false
		return
	}
	sv.res = res
	sv.end = s.q.push(res.End, evStepEnd, int32(i))
}

// endStep delivers the tokens of server i's step and starts its next. A
// run of silent steps has none to deliver.
func (s *simulation) endStep(i int) {
	sv := &s.servers[i]
	if sv.coasting {
		sv.coasting = false
		sv.eng.Settle(s.now)
	} else {
		for _, r := range sv.res.Tokens {
			f := s.flights[r.ID]
			if r.Output == 1 {
				f.first = s.now
				f.t.FirstToken()
				if s.push != nil {
					s.push.changed(int(f.replica), i)
				}
			}
			if r.State == engine.StateFinished {
				s.finish(f)
			}
		}
	}
	if sv.eng.HasWork() {
		s.step(i)
	} else {
		sv.stepping = false
	}
}

// cut ends server i's run of silent steps, if it has one, with the step in
// flight at now, so that a request arriving now joins the step after it.
func (s *simulation) cut(i int) {
	sv := &s.servers[i]
	if !sv.coasting {
		return
	}
	if end, ok := sv.eng.Cut(s.now); ok {
		sv.end = s.q.push(end, evStepEnd, int32(i))
	}
}

// scrape copies every server's metrics into replica r's view, as a scrape
// of /metrics would.
func (s *simulation) scrape(r int) {
	rep := s.replicas[r]
	at := s.clock()
	for i := range s.servers {
		s.servers[i].eng.Settle(s.now)
		st := s.servers[i].eng.Stats()
		rep.metrics[i] = fleet.Metrics{
			Running: float64(st.Running), Waiting: float64(st.Waiting), KVUsage: st.KVUsage,
			PrefixHits: float64(st.PrefixHits), PrefixQueries: float64(st.PrefixQueries), At: at,
		}
		rep.scraped[i] = s.now
	}
	rep.scrapedOnce = true
}

// gossip gives every replica the sum of the others' in-flight counts on
// each server, as a round of polls of internal/peers would.
func (s *simulation) gossip() {
	at := s.clock()
	peers := len(s.replicas) - 1
	for i := range s.servers {
		var total fleet.Load
		for _, rep := range s.replicas {
			total = total.Plus(rep.backends[i].Load())
		}
		for _, rep := range s.replicas {
			others := total.Minus(rep.backends[i].Load())
			rep.backends[i].SetPeerLoad(&fleet.PeerLoad{Load: others, Peers: peers, At: at})
		}
	}
	if s.push != nil {
		s.push.polled()
	}
}

// sample records every server's load. Past sampleCap samples a server, it
// keeps every other one and samples half as often from then on: a long run
// at ten thousand servers would otherwise keep gigabytes of samples for a
// chart of a few hundred points. The cap is even, so the sample just taken
// (at an even position) is kept and the grid stays regular.
func (s *simulation) sample() {
	for i := range s.servers {
		s.servers[i].eng.Settle(s.now)
		st := s.servers[i].eng.Stats()
		s.servers[i].samples = append(s.servers[i].samples, results.LoadSample{At: s.now, Running: st.Running, Waiting: st.Waiting, KVUsage: st.KVUsage})
	}
	if len(s.servers[0].samples) <= s.sampleCap {
		return
	}
	for i := range s.servers {
		ss := s.servers[i].samples
		for j := 0; 2*j < len(ss); j++ {
			ss[j] = ss[2*j]
		}
		s.servers[i].samples = ss[:(len(ss)+1)/2]
	}
	s.sampleEvery *= 2
}

// The load samples of all servers together stay under about sampleBudget
// (32 bytes each), and each server keeps at least minSamples.
const (
	sampleBudget = 4 << 20
	minSamples   = 256
)

// report builds the run's measurements.
func (s *simulation) report(policy string) *results.Run {
	run := &results.Run{Policy: policy, Requests: s.kept}
	run.Summary = s.sum.Summary(policy)
	busy := make([]time.Duration, len(s.servers))
	run.Backends = make([]results.BackendSeries, len(s.servers))
	for i := range s.servers {
		st := s.servers[i].eng.Stats()
		busy[i] = st.BusyTime
		run.Backends[i] = results.BackendSeries{
			Name: fmt.Sprintf("gpu%d", i), Busy: st.BusyTime,
			PromptTokens: st.PrefixQueries, CachedTokens: st.PrefixHits,
			Samples: s.servers[i].samples,
		}
	}
	run.Summary.Imbalance = results.Imbalance(busy)
	trimSamples(run.Backends, maxSampledBackends)
	return run
}

// maxSampledBackends bounds the backends whose load over time a report
// keeps: a chart of a thousand lines shows nothing, and the JSON would be
// large.
const maxSampledBackends = 32

// trimSamples keeps the samples of at most keep backends: the busiest half
// and the least busy half, which show the spread.
func trimSamples(bs []results.BackendSeries, keep int) {
	if len(bs) <= keep {
		return
	}
	idx := make([]int, len(bs))
	for i := range idx {
		idx[i] = i
	}
	sortByBusy(idx, bs)
	keepSet := make(map[int]bool, keep)
	for k := range keep / 2 {
		keepSet[idx[k]] = true
		keepSet[idx[len(idx)-1-k]] = true
	}
	for i := range bs {
		if !keepSet[i] {
			bs[i].Samples = nil
		}
	}
}

// replicaName is replica r's name, as kvroute serve's random one.
func replicaName(r int) string { return fmt.Sprintf("replica-%d", r) }
