// Package emulator serves the engine model over an OpenAI-compatible HTTP API,
// the way one vLLM server would: `kvroute emulate`.
//
// A Server owns one engine.Engine. A single driver goroutine (Run) steps the
// engine and sleeps for each step's modelled duration, scaled by
// Config.TimeScale, so tokens stream at the pace the model predicts. Prompts
// are rendered with the Llama-3 stand-in tokenizer and outputs are generated
// deterministically from the prompt, so a client that sends back the reply in
// its next turn hits the prefix cache as it would on vLLM.
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions (streaming and
// not), GET /v1/models, POST /tokenize, GET /health and GET /metrics (vLLM
// metric names), and, with Config.Admin, GET and PUT /admin/faults. With
// Config.KVEvents it publishes vLLM's KV events over ZMQ.
//
// A Server can inject faults (see Faults): hangs, 500s and 429s at a seeded
// rate, streams cut after N tokens, slow steps and a failing /health; and,
// like vLLM's --api-key, require a bearer token under /v1.
//
// Beyond what vLLM sends, responses carry the request's model-time latencies
// (seconds, as decimals) in X-Kvroute-Model-Ttft (time to first token) and
// X-Kvroute-Model-Latency (arrival to last token): as headers on
// non-streaming responses and as HTTP trailers on streams. They let tests and
// benchmarks read what the model predicted, independent of wall-clock noise.
package emulator

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/kvevents"
)

// Headers (or trailers, on streams) with a request's latencies in model
// seconds.
const (
	HeaderModelTTFT    = "X-Kvroute-Model-Ttft"
	HeaderModelLatency = "X-Kvroute-Model-Latency"
)

// maxLagWall is how far, in wall time, the driver may run behind the clock
// before it gives up on catching up and lets model time jump forward. Small
// timer overshoots are absorbed by the next sleep being shorter; a machine too
// slow for the time scale simply drops model time.
const maxLagWall = 5 * time.Millisecond

// errStopped is what in-flight and new requests get once Run has returned.
var errStopped = errors.New("emulator: server stopped")

// Config configures a Server. The zero value serves the default profile's
// model in real time.
type Config struct {
	// Model is the name the server answers to and reports; empty means
	// Profile.Model.
	Model string
	// Profile is the engine profile; a zero Profile means the built-in
	// engine.DefaultProfile.
	Profile engine.Profile
	// TimeScale converts model time to wall time: wall = model × TimeScale.
	// 1 (or 0, the default) is real time; 0.1 runs ten times faster.
	TimeScale float64
	// Seed selects the deterministic outputs: equal prompts on servers with
	// equal seeds give equal replies.
	Seed uint64
	// Logger receives the server's logs; nil means slog.Default().
	Logger *slog.Logger
	// Clock is the wall clock; nil means the system clock.
	Clock Clock

	// Faults are the failures injected from the start (none by default);
	// Server.SetFaults and PUT /admin/faults change them. The fault rates
	// draw from a source seeded by Seed, so a run is reproducible.
	Faults Faults
	// APIKey, if set, is the bearer token every request under /v1 must
	// carry, as with vLLM's --api-key; /health and /metrics stay open.
	APIKey string
	// Admin serves GET and PUT /admin/faults (the faults as JSON) to
	// clients on loopback addresses; others get 403.
	Admin bool
	// GPUID names the emulated GPUs: the fake UUIDs of the DCGM metrics
	// (dcgm.go) are hashes of it and the GPU's index, so they stay the same
	// across restarts. kvroute emulate gives each replica its listen
	// address; empty means the model name and seed.
	GPUID string
	// KVEvents, when not nil, publishes the engine's KV events as vLLM's
	// --kv-events-config does (a ZMQ PUB socket, a replay socket, a
	// topic), from the engine model's block stores and evictions. Close
	// releases the sockets.
	KVEvents *kvevents.PublisherConfig
	// LoRA, when not nil, serves LoRA adapters of the model with these
	// limits (vLLM's --enable-lora, --max-loras, --max-cpu-loras):
	// LoRAModules from the start, more through /v1/load_lora_adapter.
	LoRA        *engine.LoRA
	LoRAModules []LoRAModule
	// Disagg is the server's part in prefill/decode disaggregation
	// (disagg.go); the zero value has no KV connector.
	Disagg Disagg
}

// Server is one emulated vLLM server: an http.Handler for the OpenAI API plus
// the driver (Run) that steps its engine. Requests are only served while Run
// is running. A Server is safe for concurrent use.
type Server struct {
	model   string
	profile engine.Profile
	scale   float64
	seed    uint64
	clock   Clock
	log     *slog.Logger
	origin  time.Time // wall time of model time 0
	created int64     // Unix seconds, for /v1/models
	maxLag  time.Duration
	metrics *metrics

	mu     sync.Mutex // guards everything below and every call's req
	eng    *engine.Engine
	calls  map[uint64]*call // in the engine and not yet finished or aborted
	nextID uint64
	// mnow is the latest model time handed to the engine by Add or Step;
	// the next step never starts before it.
	mnow time.Duration

	faults     atomic.Pointer[Faults]
	faultMu    sync.Mutex // guards faultRand
	faultRand  *rand.Rand
	apiKey     bool     // requests under /v1 must carry the key
	apiKeyHash [32]byte // SHA-256 of the key
	admin      bool
	responses  responseStore // by id, for previous_response_id (responses.go)

	// gpu is the recent steps the DCGM metrics sum; guarded by mu.
	gpu gpuActivity

	// kv publishes the engine's KV events; nil when not configured.
	kv *kvEvents
	// lora is the registered LoRA adapters; nil when LoRA is off (lora.go).
	lora *adapters
	// pd is the prefill/decode disaggregation state (disagg.go).
	pd *pd

	wake    chan struct{} // cap 1: work arrived or left
	stopped chan struct{} // closed when Run returns
	started atomic.Bool
}

// call is one request in flight, shared by its HTTP handler and the driver.
type call struct {
	req    engine.Request // guarded by Server.mu
	total  int            // output tokens, the EOT included
	stop   bool           // ends with EOT (finish_reason "stop") rather than at its limit
	pieces []string       // text of the output tokens; the EOT has none

	// produced is how many output tokens the driver has delivered; notify
	// (cap 1) is poked after each increase. The driver never blocks on them.
	produced atomic.Int64
	notify   chan struct{}

	// Written by the driver before it publishes the first (cached, ttft) or
	// the last (latency) token through produced; read by the handler after
	// it has seen that count.
	cached  int
	ttft    time.Duration
	latency time.Duration

	// lastToken is the model time of the latest token; driver only.
	lastToken time.Duration
	// seq is the whole sequence, prompt and output: the token ids of its
	// KV events' blocks.
	seq []int32
}

func (c *call) finishReason() string {
	if c.stop {
		return "stop"
	}
	return "length"
}

// New returns a Server for cfg with an empty cache. Call Run to serve.
func New(cfg Config) (*Server, error) {
	p := cfg.Profile
	if p.Name == "" && p.BlockSize == 0 {
		var err error
		if p, err = engine.LookupProfile(engine.DefaultProfile); err != nil {
			return nil, err
		}
	}
	eng, err := engine.New(p)
	if err != nil {
		return nil, fmt.Errorf("emulator: %w", err)
	}
	scale := cfg.TimeScale
	if scale == 0 {
		scale = 1
	}
	if scale < 0 || math.IsNaN(scale) || math.IsInf(scale, 0) {
		return nil, fmt.Errorf("emulator: time scale %v must be positive", cfg.TimeScale)
	}
	model := cfg.Model
	if model == "" {
		model = p.Model
	}
	if model == "" {
		return nil, errors.New("emulator: no model name: set Config.Model or Profile.Model")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	clock := cfg.Clock
	if clock == nil {
		clock = realClock{}
	}
	now := clock.Now()
	s := &Server{
		model:   model,
		profile: p,
		scale:   scale,
		seed:    cfg.Seed,
		clock:   clock,
		log:     log,
		origin:  now,
		created: now.Unix(),
		maxLag:  toModel(maxLagWall, scale),
		eng:     eng,
		calls:   make(map[uint64]*call),
		wake:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
	}
	if err := cfg.Faults.Validate(); err != nil {
		return nil, err
	}
	s.faults.Store(&cfg.Faults)
	// The fault draws get their own stream so that they do not depend on
	// how many other random numbers the server used.
	s.faultRand = rand.New(rand.NewPCG(cfg.Seed, 0x6661756c7473))
	if cfg.APIKey != "" {
		s.apiKey = true
		s.apiKeyHash = sha256.Sum256([]byte(cfg.APIKey))
	}
	s.admin = cfg.Admin
	gpuID := cfg.GPUID
	if gpuID == "" {
		gpuID = fmt.Sprintf("%s/%d", model, cfg.Seed)
	}
	if cfg.LoRA != nil {
		if err := s.setLoRA(*cfg.LoRA, cfg.LoRAModules); err != nil {
			return nil, err
		}
	} else if len(cfg.LoRAModules) > 0 {
		return nil, errors.New("emulator: LoRA modules need LoRA on")
	}
	s.metrics = newMetrics(s, newDCGMCollector(s, gpuID), newLoRACollector(s))
	if s.pd, err = newPD(cfg.Disagg, s.metrics.reg, model); err != nil {
		return nil, err
	}
	if cfg.KVEvents != nil {
		pub, err := kvevents.NewPublisher(*cfg.KVEvents)
		if err != nil {
			return nil, fmt.Errorf("emulator: kv events: %w", err)
		}
		s.kv = &kvEvents{pub: pub, tokens: s.callTokens, bsize: p.BlockSize, perPage: cfg.KVEvents.Format == kvevents.FormatSGLang}
		eng.SetObserver(s.kv)
	}
	return s, nil
}

// Close releases what New opened beyond memory: the KV event sockets. Call
// it after Run has returned.
func (s *Server) Close() error {
	if s.kv == nil {
		return nil
	}
	return s.kv.pub.Close()
}

// Model returns the served model name.
func (s *Server) Model() string { return s.model }

// Profile returns the engine profile the server models.
func (s *Server) Profile() engine.Profile { return s.profile }

// Run drives the engine until ctx is done, then fails the requests still in
// flight and returns nil. It must be called once.
func (s *Server) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("emulator: Run called twice")
	}
	defer close(s.stopped)
	var (
		events  []event
		lastEnd time.Duration
	)
	for {
		s.publishEvents()
		s.mu.Lock()
		if !s.eng.HasWork() {
			s.mu.Unlock()
			select {
			case <-s.wake:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		res := s.eng.Step(s.stepStart(lastEnd))
		res.End = s.slowed(res.Start, res.End)
		s.gpu.record(res, s.profile.StepOverhead+s.profile.TPOverhead)
		events = s.collect(events[:0], res)
		s.mu.Unlock()

		if res.End <= res.Start && len(events) == 0 {
			// Nothing could be scheduled: the engine waits for a request
			// to leave. Retry on the next arrival or abort, or shortly.
			select {
			case <-s.wake:
			case <-s.clock.After(time.Millisecond):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		lastEnd = res.End
		if d := s.wallAt(res.End).Sub(s.clock.Now()); d > 0 {
			select {
			case <-s.clock.After(d):
			case <-ctx.Done():
				return nil
			}
		}
		s.deliver(events)
	}
}

// stepStart returns the model time at which the next step starts: right at
// the end of the previous one, unless a request arrived later or the driver
// has fallen too far behind the clock. Called with s.mu held.
func (s *Server) stepStart(lastEnd time.Duration) time.Duration {
	t := max(lastEnd, s.mnow)
	if now := s.modelNow(); now-t > s.maxLag {
		t = now
	}
	s.mnow = t
	return t
}

// event is one output token to hand to a handler, copied out of the engine
// while s.mu is held.
type event struct {
	c       *call
	output  int
	at      time.Duration
	arrival time.Duration
	cached  int
	first   bool
	done    bool
}

// collect turns the tokens of a step into events. Called with s.mu held.
func (s *Server) collect(dst []event, res engine.StepResult) []event {
	for _, r := range res.Tokens {
		c := s.calls[r.ID]
		if c == nil {
			continue
		}
		ev := event{
			c:       c,
			output:  r.Output,
			at:      res.End,
			arrival: r.Arrival,
			cached:  r.CachedTokens,
			first:   r.Output == 1,
			done:    r.State == engine.StateFinished,
		}
		if ev.done {
			delete(s.calls, r.ID)
		}
		dst = append(dst, ev)
	}
	return dst
}

// deliver publishes the events to their handlers and records their
// latencies. It never blocks.
func (s *Server) deliver(events []event) {
	m := s.metrics
	for i := range events {
		ev := &events[i]
		c := ev.c
		if ev.first {
			c.cached = ev.cached
			c.ttft = ev.at - ev.arrival
			m.ttft.Observe(ev.at.Seconds() - ev.arrival.Seconds())
		} else {
			m.itl.Observe(ev.at.Seconds() - c.lastToken.Seconds())
		}
		c.lastToken = ev.at
		if ev.done {
			c.latency = ev.at - ev.arrival
			m.e2e.Observe(c.latency.Seconds())
			m.success.WithLabelValues(c.finishReason()).Inc()
		}
		c.produced.Store(int64(ev.output))
		select {
		case c.notify <- struct{}{}:
		default:
		}
		events[i] = event{} // drop the reference to c
	}
}

// submit adds c to the engine. Its errors wrap engine.ErrInvalid,
// engine.ErrTooLong or errStopped.
func (s *Server) submit(c *call) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.stopped:
		return errStopped
	default:
	}
	s.nextID++
	c.req.ID = s.nextID
	now := max(s.modelNow(), s.mnow)
	if err := s.eng.Add(now, &c.req); err != nil {
		return err
	}
	s.mnow = now
	s.calls[c.req.ID] = c
	s.poke()
	return nil
}

// abort takes c out of the engine, releasing its KV blocks, unless it has
// already finished.
func (s *Server) abort(c *call) {
	s.mu.Lock()
	live := !c.req.Done()
	if live {
		s.eng.Abort(max(s.modelNow(), s.mnow), &c.req)
		delete(s.calls, c.req.ID)
		s.poke()
	}
	s.mu.Unlock()
	if live {
		s.metrics.success.WithLabelValues("abort").Inc()
	}
}

// poke wakes the driver without blocking.
func (s *Server) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// await blocks until c has more than have output tokens and returns how many
// it has. It fails if ctx is done or the server stops first.
func (s *Server) await(ctx context.Context, c *call, have int) (int, error) {
	for {
		if n := int(c.produced.Load()); n > have {
			return n, nil
		}
		select {
		case <-c.notify:
		case <-ctx.Done():
			return have, ctx.Err()
		case <-s.stopped:
			if n := int(c.produced.Load()); n > have {
				return n, nil
			}
			return have, errStopped
		}
	}
}

// Stats returns the engine's counters. Safe for concurrent use.
func (s *Server) Stats() engine.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eng.Stats()
}

// modelNow is the model time that corresponds to the clock's now.
func (s *Server) modelNow() time.Duration {
	return toModel(s.clock.Now().Sub(s.origin), s.scale)
}

// wallAt is the wall time that corresponds to model time t.
func (s *Server) wallAt(t time.Duration) time.Time {
	return s.origin.Add(time.Duration(float64(t) * s.scale))
}

// toModel converts a wall duration to model time, saturating rather than
// overflowing at tiny time scales.
func toModel(wall time.Duration, scale float64) time.Duration {
	m := float64(wall) / scale
	if m >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(m)
}
