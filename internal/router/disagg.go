package router

import (
	"fmt"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// A Splitter decides, per request, whether its prompt is prefilled on a
// prefill server and its KV cache moved to the decode server the policy
// picked (d.Backend), and on which prefill server: Split returns it, or nil
// to serve the request whole on the decode server. prefills are the
// prefill-role candidates (at least one); intN breaks ties. Implementations
// are safe for concurrent use and must not block.
type Splitter interface {
	Name() string
	Split(req *Request, d *Decision, prefills []*fleet.Backend, intN func(int) int) *fleet.Backend
}

// A SplitPricer is a Splitter that also prices the request's way through
// the prefill pool before the policy picks its decode server: SplitTTFT
// returns its predicted time to first token through the cheapest of
// prefills, for Request.SplitTTFT. The rules of thumb do not price.
type SplitPricer interface {
	Splitter
	SplitTTFT(req *Request, prefills []*fleet.Backend) time.Duration
}

// Split rules' defaults, from the peers' own: Dynamo prefills locally up to
// 1000 uncached tokens and while its prefill queue holds 2 or more; llm-d's
// prefix-based decider is configured in its guides to split from 128
// uncached tokens on.
const (
	DefaultSplitMinTokens   = 1000
	DefaultSplitMinUncached = 128
	DefaultSplitMaxQueue    = 2
)

// SplitOptions tune the rules of thumb; zero fields take the defaults.
type SplitOptions struct {
	// MinTokens is the prompt length (split-by-length) or the uncached
	// length (split-by-load) from which a request is split.
	MinTokens int
	// MinUncached is split-by-cache's threshold of tokens the decode
	// server does not hold.
	MinUncached int
	// MaxQueue is split-by-load's bound on the requests queued at the
	// least loaded prefill server.
	MaxQueue int
}

// splitRules are the rules of thumb by name, for --pd-split, bench and sim.
var splitRules = []struct {
	name, about string
	make        func(SplitOptions) Splitter
}{
	{"always", "every request through the prefill pool (vLLM's and SGLang's P/D proxies)", func(SplitOptions) Splitter { return SplitAlways{} }},
	{"never", "every request whole on its decode server: the prefill pool idles", func(SplitOptions) Splitter { return SplitNever{} }},
	{"length", "split prompts of at least MinTokens tokens", func(o SplitOptions) Splitter { return SplitByLength{MinTokens: o.MinTokens} }},
	{"cache", "split when the decode server lacks at least MinUncached of the prompt's tokens (llm-d's prefix-based decider)", func(o SplitOptions) Splitter { return SplitByCache{MinUncached: o.MinUncached} }},
	{"load", "split when over MinTokens are uncached and the prefill pool queues fewer than MaxQueue (Dynamo's conditional disaggregation)", func(o SplitOptions) Splitter {
		return SplitByLoad{MinTokens: o.MinTokens, MaxQueue: o.MaxQueue}
	}},
}

// SplitRules lists the rules of thumb's names, in the order bench and sim
// report them.
func SplitRules() []string {
	names := make([]string, len(splitRules))
	for i, r := range splitRules {
		names[i] = r.name
	}
	return names
}

// NewSplitRule returns the rule of thumb called name.
func NewSplitRule(name string, o SplitOptions) (Splitter, error) {
	if o.MinTokens <= 0 {
		o.MinTokens = DefaultSplitMinTokens
	}
	if o.MinUncached <= 0 {
		o.MinUncached = DefaultSplitMinUncached
	}
	if o.MaxQueue <= 0 {
		o.MaxQueue = DefaultSplitMaxQueue
	}
	for _, r := range splitRules {
		if r.name == name {
			return r.make(o), nil
		}
	}
	return nil, fmt.Errorf("unknown split rule %q (the rules: %s)", name, strings.Join(SplitRules(), ", "))
}

// LeastPrefill returns the prefill server with the fewest prefill tokens
// queued, then the fewest requests, ties broken by intN.
func LeastPrefill(prefills []*fleet.Backend, intN func(int) int) *fleet.Backend {
	var best *fleet.Backend
	var bl fleet.Load
	ties := 0
	for _, b := range prefills {
		l := b.Load()
		switch {
		case best == nil || l.PrefillTokens < bl.PrefillTokens || l.PrefillTokens == bl.PrefillTokens && l.Requests < bl.Requests:
			best, bl, ties = b, l, 1
		case l.PrefillTokens == bl.PrefillTokens && l.Requests == bl.Requests:
			ties++
			if intN(ties) == 0 {
				best = b
			}
		}
	}
	return best
}

// uncached is the prompt's tokens the decode server is predicted to lack.
func uncached(req *Request, d *Decision) int { return max(req.PromptTokens-d.Cached, 0) }

// SplitAlways sends every request through the prefill pool.
type SplitAlways struct{}

// Name implements Splitter.
func (SplitAlways) Name() string { return "always" }

// Split implements Splitter.
func (SplitAlways) Split(_ *Request, _ *Decision, prefills []*fleet.Backend, intN func(int) int) *fleet.Backend {
	return LeastPrefill(prefills, intN)
}

// SplitNever serves every request whole.
type SplitNever struct{}

// Name implements Splitter.
func (SplitNever) Name() string { return "never" }

// Split implements Splitter.
func (SplitNever) Split(*Request, *Decision, []*fleet.Backend, func(int) int) *fleet.Backend {
	return nil
}

// SplitByLength splits prompts of at least MinTokens tokens.
type SplitByLength struct{ MinTokens int }

// Name implements Splitter.
func (SplitByLength) Name() string { return "length" }

// Split implements Splitter.
func (s SplitByLength) Split(req *Request, _ *Decision, prefills []*fleet.Backend, intN func(int) int) *fleet.Backend {
	if req.PromptTokens < s.MinTokens {
		return nil
	}
	return LeastPrefill(prefills, intN)
}

// SplitByCache splits a request when the decode server lacks at least
// MinUncached of its prompt tokens, as llm-d's prefix-based decider does.
type SplitByCache struct{ MinUncached int }

// Name implements Splitter.
func (SplitByCache) Name() string { return "cache" }

// Split implements Splitter.
func (s SplitByCache) Split(req *Request, d *Decision, prefills []*fleet.Backend, intN func(int) int) *fleet.Backend {
	if uncached(req, d) < s.MinUncached {
		return nil
	}
	return LeastPrefill(prefills, intN)
}

// SplitByLoad is Dynamo's conditional disaggregation: a request is
// prefilled remotely when more than MinTokens of it are uncached on the
// decode server and the least loaded prefill server queues fewer than
// MaxQueue requests.
type SplitByLoad struct{ MinTokens, MaxQueue int }

// Name implements Splitter.
func (SplitByLoad) Name() string { return "load" }

// Split implements Splitter.
func (s SplitByLoad) Split(req *Request, d *Decision, prefills []*fleet.Backend, intN func(int) int) *fleet.Backend {
	if uncached(req, d) <= s.MinTokens {
		return nil
	}
	p := LeastPrefill(prefills, intN)
	if p.Load().Requests >= int64(s.MaxQueue) {
		return nil
	}
	return p
}

var (
	_ Splitter = SplitAlways{}
	_ Splitter = SplitNever{}
	_ Splitter = SplitByLength{}
	_ Splitter = SplitByCache{}
	_ Splitter = SplitByLoad{}
)
