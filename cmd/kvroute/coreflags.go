package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/kvroute"
	"github.com/kvroute/kvroute/internal/router/policies"
)

// coreFlags are where serve and epp keep what the flags they share decide:
// the policy and its options, the fleet's probes (server.CoreConfig), the
// session header.
type coreFlags struct {
	policy        *string
	fleet         *fleet.Options
	router        *policies.Options
	sessionHeader *string
}

// register defines the shared flags on fs.
func (c coreFlags) register(fs *flag.FlagSet) {
	fs.StringVar(c.policy, "policy", "kvroute", "routing policy: "+strings.Join(policies.Names(), ", "))
	fs.StringVar(c.sessionHeader, "session-header", request.DefaultSessionHeader, "request header carrying the session key")
	fs.DurationVar(&c.fleet.ScrapeInterval, "scrape-interval", time.Second, "how often backends' /metrics are scraped")
	fs.DurationVar(&c.fleet.HealthInterval, "health-interval", time.Second, "how often backends' /health is checked")
	fs.IntVar(&c.fleet.FailThreshold, "health-fails", fleet.DefaultFailThreshold, "failed /health checks in a row that take a backend out of rotation (one before its first pass; a request's refused or reset connection takes it out at once)")
	fs.IntVar(&c.fleet.PassThreshold, "health-passes", fleet.DefaultPassThreshold, "passed /health checks in a row that bring it back")
	fs.DurationVar(&c.fleet.Timeout, "probe-timeout", fleet.DefaultTimeout, "limit of each /health, /metrics and /v1/models probe (llama-server answers /metrics only between batches: give it seconds on CPUs)")
	fs.Float64Var(&c.router.KVRoute.LoadFactor, "load-factor", 2, "kvroute: no backend takes more than this × the mean in-flight requests (+4)")
	fs.IntVar(&c.router.KVRoute.BlockBytes, "block-bytes", 256, "kvroute: prefix index block size in bytes of prompt text")
	fs.BoolVar(&c.router.KVRoute.FullScan, "full-scan", false, "kvroute: score every backend on every pick, not only the prefix holders and the 16 least loaded (above 64 backends; the pick's cost then grows with the fleet)")
	fs.DurationVar(&c.router.KVRoute.AdapterLoad, "adapter-load-time", kvroute.DefaultAdapterLoad, "kvroute: what loading a LoRA adapter costs a backend that does not hold it (a rank-16 adapter of Llama-3.1-8B from storage)")
	fs.IntVar(&c.router.KVRoute.MaxLoRAs, "adapter-slots", 1, "kvroute: LoRA adapters one batch holds on a backend whose vllm:lora_requests_info gives no max_lora (vLLM's --max-loras default)")
	fs.Uint64Var(&c.router.Seed, "seed", 0, "seed of random tie-breaks (0: random)")
	objectiveFlag(fs, &c.router.KVRoute.Objective)
	fs.Func("goodput", "kvroute --objective goodput: the joint objective it serves, ttft=DURATION,tpot=DURATION (e.g. ttft=2s,tpot=50ms)", func(v string) error {
		slo, err := results.ParseSLO(v)
		c.router.KVRoute.SLO = kvroute.SLO{TTFT: slo.TTFT, TPOT: slo.TPOT}
		return err
	})
	fs.IntVar(&c.router.ResponsePins, "response-pins", router.DefaultResponsePins,
		"Responses API response ids whose backend is remembered, so that a request with previous_response_id goes back to it (0: none)")
}

// check validates the shared flags once parsed; on the command line
// --response-pins 0 means none, in policies.Options the default.
func (c coreFlags) check() error {
	f, o := c.fleet, c.router
	switch {
	case f.ScrapeInterval <= 0 || f.HealthInterval <= 0 || f.Timeout <= 0:
		return errors.New("--scrape-interval, --health-interval and --probe-timeout must be positive")
	case f.FailThreshold < 1 || f.PassThreshold < 1:
		return fmt.Errorf("--health-fails and --health-passes must be at least 1, got %d and %d", f.FailThreshold, f.PassThreshold)
	case o.KVRoute.LoadFactor < 1:
		return fmt.Errorf("--load-factor must be at least 1, got %v", o.KVRoute.LoadFactor)
	case o.KVRoute.BlockBytes < 16:
		return fmt.Errorf("--block-bytes must be at least 16, got %d", o.KVRoute.BlockBytes)
	case o.KVRoute.AdapterLoad <= 0 || o.KVRoute.MaxLoRAs < 1:
		return fmt.Errorf("--adapter-load-time must be positive and --adapter-slots at least 1, got %v and %d", o.KVRoute.AdapterLoad, o.KVRoute.MaxLoRAs)
	case o.ResponsePins < 0:
		return fmt.Errorf("--response-pins must not be negative, got %d", o.ResponsePins)
	case o.ResponsePins == 0:
		o.ResponsePins = -1
	}
	return nil
}
