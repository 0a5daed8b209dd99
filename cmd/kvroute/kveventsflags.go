package main

import (
	"flag"
	"fmt"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/kvevents/follow"
)

// kvEventsConfig is what the KV event flags decide: where the backends'
// engines publish their KV events (vLLM's --kv-events-config), which
// kvroute then follows for exact cached blocks.
type kvEventsConfig struct {
	port, replayPort int
	endpoints        stringList
	listen           string
	topic            string
	replayTimeout    time.Duration
	retry            time.Duration
	probe            time.Duration
	tokenizeTimeout  time.Duration
	tokenizeCache    int
}

func (c *kvEventsConfig) register(fs *flag.FlagSet) {
	fs.IntVar(&c.port, "kv-events-port", 0, "follow every backend's engine KV events on tcp://BACKEND_HOST:PORT (vLLM's --kv-events-config endpoint, tcp://*:5557 by default); 0: only --kv-events")
	fs.IntVar(&c.replayPort, "kv-events-replay-port", 0, "the engines' KV event replay port beside --kv-events-port (vLLM's replay_endpoint); 0: none, a gap resets that backend's state")
	fs.Var(&c.endpoints, "kv-events", "a backend's KV event sockets, NAME=tcp://HOST:PORT[,tcp://HOST:REPLAYPORT] (repeatable; overrides --kv-events-port for that backend)")
	fs.StringVar(&c.listen, "kv-events-listen", "", "bind this ZMQ SUB `ENDPOINT` (tcp://*:5557) for engines that connect to the router and name themselves in their topic as llm-d does, kv@HOST:PORT@MODEL (a backend URL's host and port) or kv@HOST@MODEL (the one backend on HOST)")
	fs.StringVar(&c.topic, "kv-events-topic", "", "topic of the engines' KV event messages (vLLM's kv_events_config topic; empty: any)")
	fs.DurationVar(&c.replayTimeout, "kv-events-replay-timeout", kvevents.DefaultReplayTimeout, "limit of one replay request for missed KV event batches")
	fs.DurationVar(&c.retry, "kv-events-retry", kvevents.DefaultRetry, "wait before reconnecting to an engine's KV event socket")
	fs.DurationVar(&c.probe, "kv-events-probe", kvevents.DefaultProbe, "after this long without a KV event batch from an engine, ask its replay socket for any batch past the last one applied (a batch lost just before a lull is otherwise missed until the next arrives); 0: never")
	fs.DurationVar(&c.tokenizeTimeout, "kv-events-tokenize-timeout", follow.DefaultTokenizeTimeout, "limit of a backend /tokenize call for a prompt's token ids (past it the prefix index decides)")
	fs.IntVar(&c.tokenizeCache, "kv-events-tokenize-cache", follow.DefaultTokenizeCache, "prompts whose token ids are kept")
}

// config checks the flags and returns the follower's config, nil when no
// backend's events are followed.
func (c *kvEventsConfig) config(client *http.Client) (*follow.FollowConfig, error) {
	if c.port == 0 && len(c.endpoints) == 0 && c.listen == "" {
		return nil, nil
	}
	for _, p := range []int{c.port, c.replayPort} {
		if p < 0 || p > 65535 {
			return nil, fmt.Errorf("--kv-events-port and --kv-events-replay-port must be TCP ports, got %d", p)
		}
	}
	if c.replayTimeout <= 0 || c.retry <= 0 || c.tokenizeTimeout <= 0 || c.tokenizeCache <= 0 {
		return nil, fmt.Errorf("the --kv-events-* timeouts, retry and cache must be positive")
	}
	if c.probe < 0 {
		return nil, fmt.Errorf("--kv-events-probe must not be negative (0: never)")
	}
	probe := c.probe
	if probe == 0 {
		probe = -1 // the subscriber's "never"; its 0 is the default
	}
	fc := &follow.FollowConfig{Port: c.port, ReplayPort: c.replayPort, Topic: c.topic, Listen: c.listen,
		ReplayTimeout: c.replayTimeout, Retry: c.retry, Probe: probe, Endpoints: map[string]kvevents.Source{},
		Tokenizer: follow.NewTokenizer(client, c.tokenizeTimeout, c.tokenizeCache)}
	for _, e := range c.endpoints {
		name, src, err := follow.ParseEndpoint(e)
		if err != nil {
			return nil, err
		}
		fc.Endpoints[name] = src
	}
	return fc, nil
}
