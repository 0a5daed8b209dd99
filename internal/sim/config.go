package sim

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/results"
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
	// Servers, when set, is each server's own profile (one per backend: a
	// fleet of GPU generations or of several models, mixed.go); Profile is
	// then the first's, named for the fleet.
	Servers []engine.Profile
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
	// stale counts from what it loses by itself
	// (docs/decisions/0005-pushed-peer-counts.md). kvroute is told (kvroute.Config.PeersExact), and
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
	// does (internal/router/kvroute/replicas.go). As one router it herds
	// in bursts, hence the lanes (docs/decisions/0005-pushed-peer-counts.md,
	// 0001-router-replica-lanes.md).
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
	// Prefill is how many of the Backends are prefill servers (the last
	// ones); 0 means none, an aggregated fleet. A policy named
	// POLICY@SPLITTER splits with that splitter (policies.NewSplitter;
	// default priced).
	Prefill int
	// Split tunes the splitters; LinkBandwidth is the KV transfer's
	// bytes/s (0: DefaultLinkBandwidth).
	Split         policies.SplitOptions
	LinkBandwidth float64

	// DataParallel, above 1, groups the Backends engines into servers of
	// that many data-parallel ranks, named gpuI/dpR as kvroute serve
	// --dp-ranks names them: a rank is an engine of its own, and the
	// router routes to each (dprank.go).
	DataParallel int
	// LoRA, when not nil, makes every server serve LoRA adapters with
	// these limits (engine.LoRA); a workload whose sessions name adapters
	// needs it.
	LoRA *engine.LoRA

	stepwise bool // step every step (tests check that coasting changes nothing)
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
	case c.DataParallel > 1 && c.Backends%c.DataParallel != 0:
		return c, fmt.Errorf("sim: %d engines are not servers of %d data-parallel ranks", c.Backends, c.DataParallel)
	case c.LoRA == nil && len(c.Workload.Adapters()) > 0:
		return c, errors.New("sim: the workload names LoRA adapters: give the servers' LoRA limits (--max-loras)")
	case c.Tile > 1 && !tokenMode(c):
		return c, errors.New("sim: tiling needs a workload of single-turn, block-described requests (a trace or mixed) without --text")
	}
	return c, c.checkMixed()
}
