// Package follow follows a fleet's engine KV events for kvroute: a
// kvevents.Subscriber per backend as the fleet changes, one
// kvevents.Store, and a router.KVEvents that matches a request's token ids
// (from the backend's own /tokenize) against it.
package follow

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/router"
)

// FollowConfig says where a fleet's engines publish their KV events.
type FollowConfig struct {
	// Port is the PUB port every backend's engine publishes on, at its
	// URL's host (vLLM's default endpoint is tcp://*:5557); 0: only the
	// backends in Endpoints.
	Port int
	// ReplayPort is the replay (ROUTER) port beside it (vLLM's
	// replay_endpoint, often 5558); 0: none, a gap resets the state.
	ReplayPort int
	// Endpoints are the sources of named backends, overriding Port.
	Endpoints map[string]kvevents.Source
	// Listen, when set, is a SUB socket to bind (tcp://*:5557) that
	// engines connect to, each naming itself in its topic as llm-d does:
	// kv@HOST:PORT@MODEL, or kv@HOST@MODEL for the one backend on HOST
	// (topicNames).
	Listen string
	// Topic is the engines' topic ("" matches every topic).
	Topic string
	// ReplayTimeout, Retry and Probe tune the subscribers (see
	// kvevents.SubscriberOptions).
	ReplayTimeout, Retry, Probe time.Duration
	// Tokenizer gets the requests' token ids; nil: NewTokenizer's defaults.
	Tokenizer *Tokenizer
	// Metrics counts the events; nil counts nothing.
	Metrics *kvevents.Metrics
	// Log receives state changes; nil: none.
	Log *slog.Logger
}

// ParseEndpoint reads a serve flag value NAME=PUB[,REPLAY], e.g.
// gpu0=tcp://10.0.0.5:5557,tcp://10.0.0.5:5558.
func ParseEndpoint(v string) (string, kvevents.Source, error) {
	name, rest, ok := strings.Cut(v, "=")
	if !ok || name == "" || rest == "" {
		return "", kvevents.Source{}, fmt.Errorf("kv events endpoint %q: want NAME=tcp://HOST:PORT[,tcp://HOST:REPLAYPORT]", v)
	}
	pub, replay, _ := strings.Cut(rest, ",")
	for _, e := range []string{pub, replay} {
		if e != "" && !strings.HasPrefix(e, "tcp://") {
			return "", kvevents.Source{}, fmt.Errorf("kv events endpoint %q: %q is not tcp://HOST:PORT", v, e)
		}
	}
	return name, kvevents.Source{Name: name, Endpoint: pub, Replay: replay}, nil
}

// Follower subscribes to every backend's KV events as the fleet changes,
// and tells kvroute what each holds of a prompt (router.KVEvents). It is
// safe for concurrent use.
type Follower struct {
	cfg   FollowConfig
	store *kvevents.Store
	tok   *Tokenizer
	log   *slog.Logger

	mu   sync.Mutex
	ctx  context.Context // the subscribers' parent, set by Start
	subs map[int]*following
	// hosts are the fleet's backends by the names their engines give
	// themselves in Listen's topics (topicNames); a name of several
	// backends maps to nil.
	hosts map[string]*fleet.Backend
	// members are the fleet's backends' names by index.
	members map[int]string
	wg      sync.WaitGroup
}

type following struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{}
}

var (
	_ router.KVEvents     = (*Follower)(nil)
	_ router.FleetWatcher = (*Follower)(nil)
)

// NewFollower returns a follower of cfg's sources; Start starts it.
func NewFollower(cfg FollowConfig) *Follower {
	f := &Follower{cfg: cfg, store: kvevents.NewStore(kvevents.KeyTokens), tok: cfg.Tokenizer, log: cfg.Log, subs: make(map[int]*following)}
	if f.tok == nil {
		f.tok = NewTokenizer(nil, 0, 0)
	}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	return f
}

// Store returns the blocks the follower knows of.
func (f *Follower) Store() *kvevents.Store { return f.store }

// Start subscribes to backends' events until ctx is done; SetBackends
// follows the fleet's changes after it.
func (f *Follower) Start(ctx context.Context, backends []*fleet.Backend) {
	f.mu.Lock()
	f.ctx = ctx
	f.mu.Unlock()
	f.SetBackends(backends)
	if f.cfg.Listen != "" {
		l, err := kvevents.Listen(ctx, f.cfg.Listen, f.resolve, f.store, f.subscriberOptions())
		if err != nil {
			f.log.Error("kv events: cannot listen; the index decides for the engines that connect", "endpoint", f.cfg.Listen, "err", err)
			return
		}
		f.wg.Go(func() { l.Run(ctx) })
	}
}

func (f *Follower) subscriberOptions() kvevents.SubscriberOptions {
	return kvevents.SubscriberOptions{ReplayTimeout: f.cfg.ReplayTimeout, Retry: f.cfg.Retry, Probe: f.cfg.Probe, Metrics: f.cfg.Metrics, Log: f.log}
}

// resolve returns the source of the engine publishing on topic, to Listen:
// the backend at the topic's host, its replay socket at ReplayPort.
func (f *Follower) resolve(topic string) (kvevents.Source, bool) {
	host, ok := kvevents.TopicHost(topic)
	if !ok {
		return kvevents.Source{}, false
	}
	f.mu.Lock()
	b := f.hosts[host]
	f.mu.Unlock()
	if b == nil {
		return kvevents.Source{}, false
	}
	src := kvevents.Source{Backend: b.Index, Name: b.Name, Endpoint: f.cfg.Listen, Topic: topic}
	if f.cfg.ReplayPort > 0 {
		src.Replay = "tcp://" + net.JoinHostPort(b.URL.Hostname(), strconv.Itoa(f.cfg.ReplayPort))
	}
	return src, true
}

// topicNames are the names an engine may give itself in its topic for
// backend URL u: HOST:PORT, its serving port (llm-d's simulator and
// endpoint picker name a pod so, which tells apart engines sharing a
// host), and HOST alone (older topics: one engine per host).
func topicNames(u *url.URL) (host, hostPort string) {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return u.Hostname(), net.JoinHostPort(u.Hostname(), port)
}

// Wait returns once every subscriber has stopped (after Start's ctx is
// done).
func (f *Follower) Wait() { f.wg.Wait() }

// source returns b's event source, if it publishes any.
func (f *Follower) source(b *fleet.Backend) (kvevents.Source, bool) {
	if src, ok := f.cfg.Endpoints[b.Name]; ok {
		src.Backend, src.Name, src.Topic = b.Index, b.Name, f.cfg.Topic
		return src, true
	}
	if f.cfg.Port <= 0 || b.URL == nil {
		return kvevents.Source{}, false
	}
	host := b.URL.Hostname()
	src := kvevents.Source{Backend: b.Index, Name: b.Name, Topic: f.cfg.Topic,
		Endpoint: "tcp://" + net.JoinHostPort(host, strconv.Itoa(f.cfg.Port))}
	if f.cfg.ReplayPort > 0 {
		src.Replay = "tcp://" + net.JoinHostPort(host, strconv.Itoa(f.cfg.ReplayPort))
	}
	return src, true
}

// SetBackends implements router.FleetWatcher: it subscribes to new
// backends' events and stops following removed ones, whose blocks it then
// forgets (their late events are dropped with their subscriber).
func (f *Follower) SetBackends(backends []*fleet.Backend) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctx == nil {
		return
	}
	keep := make(map[int]bool, len(backends))
	f.hosts = make(map[string]*fleet.Backend, len(backends))
	for _, b := range backends {
		if b.URL == nil {
			continue
		}
		host, hostPort := topicNames(b.URL)
		for _, name := range []string{host, hostPort} {
			if _, dup := f.hosts[name]; dup {
				f.hosts[name] = nil // ambiguous
			} else {
				f.hosts[name] = b
			}
		}
	}
	for _, b := range backends {
		src, ok := f.source(b)
		if !ok {
			continue
		}
		keep[b.Index] = true
		if f.subs[b.Index] != nil {
			continue
		}
		ctx, cancel := context.WithCancel(f.ctx)
		fl := &following{name: b.Name, cancel: cancel, done: make(chan struct{})}
		f.subs[b.Index] = fl
		sub := kvevents.NewSubscriber(src, f.store, f.subscriberOptions())
		f.wg.Go(func() {
			defer close(fl.done)
			sub.Run(ctx)
		})
	}
	members := make(map[int]string, len(backends))
	for _, b := range backends {
		members[b.Index] = b.Name
	}
	for i, name := range f.members {
		if _, ok := members[i]; ok {
			continue
		}
		if f.subs[i] == nil { // a listened-to engine's: resolve drops its topic now
			f.store.Remove(i)
			f.cfg.Metrics.Forget(name)
		}
	}
	f.members = members
	for i, fl := range f.subs {
		if keep[i] {
			continue
		}
		delete(f.subs, i)
		fl.cancel()
		f.wg.Go(func() {
			<-fl.done
			f.store.Remove(i)
			f.cfg.Metrics.Forget(fl.name)
		})
	}
}

// Match implements router.KVEvents: it asks a candidate's /tokenize for the
// prompt's token ids (cached), hashes them per block size as the store
// keys blocks, and counts each candidate's leading blocks on the GPU. A
// backend without fresh events, or a prompt that cannot be tokenized in
// time, is left unknown: the index decides there.
func (f *Follower) Match(req *router.Request, cands []*fleet.Backend, dst []router.KVState) {
	clear(dst)
	if len(req.Body) == 0 || !f.anyKnown(cands) {
		return
	}
	toks, err := f.tok.Tokens(context.Background(), cands[0], req.Body)
	if err != nil {
		f.log.Debug("kv events: no token ids; the index decides", "err", err)
		return
	}
	var bs int
	var keys []uint64
	keyFor := func(blockSize int) []uint64 {
		if blockSize != bs {
			// The engine reuses at most the blocks before the prompt's
			// last token: it must compute one to sample from.
			bs, keys = blockSize, kvevents.TokenChain(keys[:0], toks[:max(0, len(toks)-1)], blockSize)
		}
		return keys
	}
	idx := make([]int, len(cands))
	for i, b := range cands {
		idx[i] = b.Index
	}
	matched := make([]kvevents.Matched, len(cands))
	f.store.MatchGPU(idx, keyFor, matched)
	for i, m := range matched {
		dst[i] = router.KVState{Tokens: m.Blocks * m.BlockSize, Known: m.State != kvevents.Unknown, Exact: m.State == kvevents.Exact}
	}
}

var _ router.KVHolders = (*Follower)(nil)

// Holders implements router.KVHolders: the backends whose events say they
// hold the deepest part of the prompt, for a pick that scores only a few
// candidates. It tokenizes the prompt as Match does (the same cached
// /tokenize answer serves both).
func (f *Follower) Holders(req *router.Request, cands []*fleet.Backend, dst []int32, want int) []int32 {
	if len(req.Body) == 0 || len(cands) == 0 || want <= 0 || !f.store.Holding() {
		return dst
	}
	toks, err := f.tok.Tokens(context.Background(), cands[0], req.Body)
	if err != nil {
		return dst
	}
	return f.store.Deepest(dst, func(blockSize int) []uint64 {
		return kvevents.TokenChain(nil, toks[:max(0, len(toks)-1)], blockSize)
	}, want)
}

// anyKnown reports whether some candidate's events say anything: else a
// prompt need not be tokenized.
func (f *Follower) anyKnown(cands []*fleet.Backend) bool {
	for _, b := range cands {
		if st, _ := f.store.Status(b.Index); st != kvevents.Unknown {
			return true
		}
	}
	return false
}
