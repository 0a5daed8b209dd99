// Package policies is the registry of routing policies: every policy's
// --policy name, its line for --help and its constructor, in one explicit
// list that imports each policy family's package (kvroute, the classic
// baselines, the other LLM routers' policies). --help, config validation,
// the bench and the simulator all read it; nothing registers itself.
package policies

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/baseline"
	"github.com/kvroute/kvroute/internal/router/kvroute"
	"github.com/kvroute/kvroute/internal/router/llmrouters"
)

// Options configure the policies built by New.
type Options struct {
	// Seed seeds random choices; 0 picks a random seed.
	Seed uint64
	// KVRoute tunes the kvroute policy.
	KVRoute kvroute.Config
	// Baseline tunes the classic balancers (session-bounded's slack).
	Baseline baseline.Config
	// Peers tunes the policies reimplemented from other routers.
	Peers llmrouters.Config
	// Metrics returns a backend's latest scraped metrics, or nil when there
	// are none or they are stale (fleet.Fleet.Metrics does both). Policies
	// that read scraped load (llmd-default; kvroute for engines with slots)
	// fall back to the router's own counts without it. Nil means no scraped
	// metrics. Must be safe for concurrent use and must not block.
	Metrics func(*fleet.Backend) *fleet.Metrics
	// Now is the policies' clock; nil means time.Now. The simulator passes
	// its virtual clock.
	Now func() time.Time
	// Tokens is the router's prompt-length estimator, which New shares
	// with the policy; nil means a fresh one.
	Tokens *router.Tokens
	// ResponsePins is how many Responses API response ids the Router
	// remembers the backend of, to send the requests that continue them
	// there (0: router.DefaultResponsePins; negative: none).
	ResponsePins int
}

// registry is every policy New knows, the default first: --help, config
// validation, the bench and the simulator all read this one list.
var registry = []Spec{
	{"kvroute", "kvroute's cost model: predicted TTFT (cached prefix, queued prefill, KV room) plus its stream and its delay to the streams there",
		func(bs []*fleet.Backend, o Options) router.Policy {
			cfg := o.KVRoute
			cfg.Seed = cmp.Or(cfg.Seed, o.Seed)
			if cfg.Now == nil {
				cfg.Now = o.Now
			}
			if cfg.Metrics == nil {
				cfg.Metrics = o.Metrics
			}
			if cfg.Tokens == nil {
				cfg.Tokens = o.Tokens
			}
			return kvroute.New(bs, cfg)
		}},
	{"round-robin", "each backend in turn", func([]*fleet.Backend, Options) router.Policy { return &baseline.RoundRobin{} }},
	{"least-request", "fewest requests in flight, random among ties",
		func(_ []*fleet.Backend, o Options) router.Policy { return baseline.NewLeastRequest(o.Seed) }},
	{"session-hash", "consistent hashing of the session key (nginx hash consistent, HAProxy balance hdr)",
		func(bs []*fleet.Backend, o Options) router.Policy { return baseline.NewSessionHash(bs, o.Seed) }},
	{"random", "a uniformly random backend", func(_ []*fleet.Backend, o Options) router.Policy { return baseline.NewRandom(o.Seed) }},
	{"p2c", "power of two choices: the lighter of two random backends",
		func(_ []*fleet.Backend, o Options) router.Policy { return baseline.NewP2C(o.Seed) }},
	{"session-bounded", "consistent hashing with bounded loads (Mirrokni et al.)",
		func(bs []*fleet.Backend, o Options) router.Policy {
			return baseline.NewSessionBounded(bs, o.Seed, o.Baseline)
		}},
	{"sglang-cache-aware", "SGLang router's cache-aware policy: longest character prefix unless imbalanced",
		func(_ []*fleet.Backend, o Options) router.Policy {
			return llmrouters.NewSGLangCacheAware(o.Seed, o.Peers)
		}},
	{"dynamo-kv", "NVIDIA Dynamo's KV router cost: prefill blocks + decode blocks",
		func(bs []*fleet.Backend, o Options) router.Policy { return llmrouters.NewDynamoKV(bs, o.Seed, o.Peers) }},
	{"llmd-default", "llm-d's default scorers: queue depth, KV utilisation, prefix match",
		func(bs []*fleet.Backend, o Options) router.Policy {
			return llmrouters.NewLLMDDefault(bs, o.Seed, o.Peers, o.Metrics)
		}},
	{"llmd-lora", "llm-d's default scorers and its lora-affinity scorer: the adapter running there, else room for one more",
		func(bs []*fleet.Backend, o Options) router.Policy {
			return llmrouters.NewLLMDLoRA(bs, o.Seed, o.Peers, o.Metrics)
		}},
	{"preble-e2", "Preble's E2: exploit a cached prefix longer than the rest, else explore by load",
		func(bs []*fleet.Backend, o Options) router.Policy { return llmrouters.NewPrebleE2(bs, o.Seed, o.Peers) }},
}

func names() string { return strings.Join(Names(), ", ") }

// Spec is one policy in the registry: its --policy name, a line for --help,
// and its constructor for a fleet of backends (their Index fields number
// them 0..len-1; nil when only validating the name).
type Spec struct {
	// Name is the --policy value.
	Name string
	// Doc is the line --help shows.
	Doc string
	// New builds the policy; it must accept nil backends.
	New func(backends []*fleet.Backend, opts Options) router.Policy
}

// New returns a Router driving the policy called name for a fleet of
// backends.
func New(name string, backends []*fleet.Backend, opts Options) (*router.Router, error) {
	name, err := withObjective(name, &opts)
	if err != nil {
		return nil, err
	}
	for _, s := range registry {
		if s.Name == name {
			if opts.Tokens == nil {
				opts.Tokens = router.NewTokens()
			}
			return router.NewPinningRouter(s.New(backends, opts), opts.Tokens, opts.ResponsePins), nil
		}
	}
	return nil, fmt.Errorf("unknown policy %q (have %s)", name, names())
}

// Names lists the policies New knows, the default first.
func Names() []string {
	out := make([]string, len(registry))
	for i, s := range registry {
		out[i] = s.Name
	}
	return out
}

// Specs lists the registry: every policy with its one-line description.
func Specs() []Spec { return slices.Clone(registry) }

// Uncalibrated is the variant of kvroute that prices and predicts with the
// built-in engine model alone (kvroute.Config.NoCalibration), as in
// kvroute:uncalibrated: the bench and the simulator show what calibration
// changes beside it.
const Uncalibrated = "uncalibrated"

// withObjective reads a policy name of the form kvroute:OBJECTIVE or
// kvroute:uncalibrated (the bench and the simulator compare variants side
// by side so), sets the variant in opts and returns the registry's name.
func withObjective(name string, opts *Options) (string, error) {
	base, obj, ok := strings.Cut(name, ":")
	if !ok {
		return name, nil
	}
	switch {
	case base == "kvroute" && obj == Uncalibrated:
		opts.KVRoute.NoCalibration = true
	case base == "kvroute" && slices.Contains(kvroute.Objectives(), kvroute.Objective(obj)):
		opts.KVRoute.Objective = kvroute.Objective(obj)
	default:
		return name, fmt.Errorf("unknown policy %q (a variant goes with kvroute: kvroute:ttft, kvroute:e2e, kvroute:goodput, kvroute:uncalibrated)", name)
	}
	return base, nil
}
