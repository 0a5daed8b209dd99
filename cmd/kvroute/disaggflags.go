package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/kvroute"
	"github.com/kvroute/kvroute/internal/router/policies"
)

// disaggConfig is what the prefill/decode flags decide: the prefill
// servers, and how each request is split between the pools.
type disaggConfig struct {
	prefills      stringList
	splitter      string
	timeout       time.Duration
	attempts      int
	opts          policies.SplitOptions
	kvBytes, link float64
	bootstrapPort int
}

func (c *disaggConfig) register(fs *flag.FlagSet) {
	fs.Var(&c.prefills, "prefill-backend", "a prefill server as [name=]URL, as --backend (repeatable): chat and completion requests may be prefilled there and decoded on a --backend (a config file's backends take role: prefill instead)")
	fs.DurationVar(&c.timeout, "pd-prefill-timeout", proxy.DefaultPrefillTimeout, "limit of one prefill leg, send to answer; past it another prefill server is tried, or the decode server prefills")
	fs.IntVar(&c.bootstrapPort, "pd-bootstrap-port", 0, "the --prefill-backend servers' SGLang bootstrap port (their --disaggregation-bootstrap-port, 8998 by default): their legs go SGLang's way, at once with the decode's and a bootstrap room; 0: vLLM's way")
	fs.IntVar(&c.attempts, "pd-prefill-attempts", proxy.DefaultPrefillAttempts, "prefill servers one request tries before its decode server prefills it")
	c.registerSplit(fs)
}

// registerSplit registers the splitter's flags, which epp shares.
func (c *disaggConfig) registerSplit(fs *flag.FlagSet) {
	fs.StringVar(&c.splitter, "pd-split", policies.DefaultSplitter, "how each request is split between prefill and decode servers: priced (kvroute's price in seconds), always, never, length, cache (llm-d's prefix-based decider) or load (Dynamo's conditional disaggregation)")
	fs.IntVar(&c.opts.Rules.MinTokens, "pd-min-tokens", router.DefaultSplitMinTokens, "--pd-split length and load: the prompt (length) or uncached (load) tokens from which a request is split")
	fs.IntVar(&c.opts.Rules.MinUncached, "pd-min-uncached", router.DefaultSplitMinUncached, "--pd-split cache: the uncached tokens on the decode server from which a request is split")
	fs.IntVar(&c.opts.Rules.MaxQueue, "pd-max-queue", router.DefaultSplitMaxQueue, "--pd-split load: split only while the least loaded prefill server has fewer requests in flight")
	fs.Float64Var(&c.kvBytes, "pd-kv-bytes-per-token", kvroute.DefaultKVBytesPerToken, "--pd-split priced: the model's KV cache bytes per token (2 × layers × KV heads × head dim × bytes per element)")
	fs.Float64Var(&c.link, "pd-link-bandwidth", kvroute.DefaultLinkBandwidth, "--pd-split priced: the KV transfer link's bandwidth between prefill and decode servers, in bytes/s")
}

// addBackends appends the --prefill-backend servers to cfg's backends.
func (c *disaggConfig) addBackends(cfg *serveConfig) error {
	for _, spec := range c.prefills {
		b, err := fleet.ParseBackend(len(cfg.backends), spec)
		if err != nil {
			return backendError(err)
		}
		for _, other := range cfg.backends {
			if other.Name == b.Name || other.URL.String() == b.URL.String() {
				return fmt.Errorf("--prefill-backend %q: backend %q is given twice", spec, b.Name)
			}
		}
		b.SetRole(fleet.RolePrefill)
		if err := b.SetBootstrapPort(c.bootstrapPort); err != nil {
			return fmt.Errorf("--pd-bootstrap-port: %w", err)
		}
		cfg.backends = append(cfg.backends, b)
		cfg.discovery.fixed = append(cfg.discovery.fixed, b)
	}
	return nil
}

// config checks the flags and returns the proxy's disaggregation config.
func (c *disaggConfig) config() (proxy.Disagg, error) {
	if c.attempts < 1 || c.timeout <= 0 {
		return proxy.Disagg{}, fmt.Errorf("--pd-prefill-attempts must be at least 1 and --pd-prefill-timeout positive")
	}
	s, err := c.split()
	if err != nil {
		return proxy.Disagg{}, err
	}
	return proxy.Disagg{Splitter: s, PrefillTimeout: c.timeout, PrefillAttempts: c.attempts}, nil
}

// split checks the splitter's flags and returns it.
func (c *disaggConfig) split() (router.Splitter, error) {
	if c.kvBytes <= 0 || c.link <= 0 {
		return nil, fmt.Errorf("--pd-kv-bytes-per-token and --pd-link-bandwidth must be positive")
	}
	o := c.opts
	o.Price.KVBytesPerToken, o.Price.LinkBandwidth = c.kvBytes, c.link
	s, err := policies.NewSplitter(c.splitter, o)
	if err != nil {
		return nil, fmt.Errorf("--pd-split: %w", err)
	}
	return s, nil
}
