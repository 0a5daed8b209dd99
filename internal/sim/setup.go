package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/kvroute"
	"github.com/kvroute/kvroute/internal/router/policies"
)

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
	busy        []time.Duration // each server's busy time at its last scrape
	scrapedOnce bool
	serving     map[string][]*fleet.Backend // by model, for a fleet of several (mixed.go)
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
	adapters    adapters // the workload's LoRA adapters (lora.go)
	push        *pushFeed
	pd          *pdState // the prefill pool; nil without Config.Prefill (disagg.go)
}

// sessionRef is one session of the (tiled) workload.
type sessionRef struct {
	start time.Duration
	base  int32
	tile  int32
}

// newSimulation builds the fleet and the router replicas of one policy's
// run, at virtual time 0.
func newSimulation(cfg Config, policy string, withBounds bool) (*simulation, error) {
	policy, splitter := splitPolicy(policy) // disagg.go
	pd, err := newPD(cfg, splitter)
	if err != nil {
		return nil, err
	}
	s := &simulation{
		pd:       pd,
		cfg:      cfg,
		text:     !tokenMode(cfg),
		bounds:   withBounds,
		stepwise: cfg.stepwise,
		split:    rand.New(rand.NewPCG(cfg.Seed, 0x73706c6974)),
		origin:   time.Unix(0, 0),
	}
	infos := serverInfos(&cfg)
	s.servers = make([]server, cfg.Backends)
	for i := range s.servers {
		e, err := engine.New(cfg.serverProfile(i))
		if err != nil {
			return nil, err
		}
		s.servers[i].eng = e
	}
	if err := s.setLoRA(); err != nil {
		return nil, err
	}
	if cfg.KVEvents {
		s.kv = newKVFeed(s)
	}
	for r := range cfg.Routers {
		rep := &replica{
			metrics: make([]fleet.Metrics, cfg.Backends),
			scraped: make([]time.Duration, cfg.Backends),
			busy:    make([]time.Duration, cfg.Backends),
		}
		for i := range cfg.Backends {
			b := fleet.NewBackend(i, cfg.serverName(i), nil)
			b.SetInfo(infos[i])
			rep.backends = append(rep.backends, b)
		}
		rep.serving = servingModels(&cfg, rep.backends)
		opts := s.replicaOptions(r, rep)
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
	if s.pd != nil {
		s.setupPD() // disagg.go
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

// replicaOptions configures replica r's policy: its own seed, its view of
// the scraped metrics, the virtual clock, and what kvroute is told of the
// other replicas, the engines' events and the workload's blocks.
func (s *simulation) replicaOptions(r int, rep *replica) policies.Options {
	cfg := s.cfg
	opts := policies.Options{
		Seed:    cfg.Seed + uint64(r)*0x9e3779b97f4a7c15,
		Metrics: s.metricsFunc(rep),
		Now:     s.clock,
	}
	opts.KVRoute.FullScan = cfg.FullScan
	if cfg.LoRA != nil {
		opts.KVRoute.AdapterLoad = cfg.LoRA.LoadDisk
	}
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
	return opts
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

// replicaName is replica r's name, as kvroute serve's random one.
func replicaName(r int) string { return fmt.Sprintf("replica-%d", r) }
