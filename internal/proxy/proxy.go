// Package proxy is the OpenAI-compatible HTTP front of `kvroute serve`.
//
// For each chat, completion, Responses API (/v1/responses) or Anthropic
// Messages API (/v1/messages) request it reads the body once into the
// router's request facts (model, session key, the prompt rendered
// canonically, max tokens), asks the routing policy to pick one of the
// healthy backends that serve the model, counts the request on that backend
// at once, and forwards it. Responses stream back event by event; on the way
// the proxy notes the first content chunk (the backend's prefill is done),
// the usage the backend reports (how many prompt tokens it had cached) and
// the end, releases the backend's load in the same place it counted it, and
// reports the outcome to policies that learn. A backend that refuses the
// connection is taken out of rotation and the request goes to another.
//
// Embeddings are routed by load alone; other /v1 endpoints go to the least
// loaded healthy backend that serves the request's model.
package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/baseline"
	"github.com/kvroute/kvroute/internal/upstream"
)

// Response headers that explain each routed request.
const (
	// HeaderBackend names the backend that served the request.
	HeaderBackend = "X-Kvroute-Backend"
	// HeaderRoute is the routing decision's reason ("prefix", "least-request", ...).
	HeaderRoute = "X-Kvroute-Route"
	// HeaderPredictedTTFTSeconds is the time to first token the policy
	// predicted on the chosen backend, the prediction the request was
	// routed on, in seconds (as the emulator's X-Kvroute-Model-Ttft); sent
	// whenever the policy predicts. A client's own TTFT tells it as much of
	// the fleet's cache, so it is not held back with Config.Explain's.
	HeaderPredictedTTFTSeconds = "X-Kvroute-Predicted-Ttft"
)

// The headers Config.Explain adds, for policies that predict: the prompt
// tokens expected cached on the chosen backend, the time to first token
// expected there in milliseconds, its prediction interval in seconds
// ("low high", kvroute's 80 % interval), and the mean time between the
// stream's tokens in seconds (kvroute when it prices streams).
const (
	HeaderPredictedCached       = "X-Kvroute-Predicted-Cached"
	HeaderPredictedTTFT         = "X-Kvroute-Predicted-Ttft-Ms"
	HeaderPredictedTTFTInterval = "X-Kvroute-Predicted-Ttft-Interval"
	HeaderPredictedITL          = "X-Kvroute-Predicted-Itl"
)

// Fleet is what the proxy needs of the fleet of backends. Implementations
// are safe for concurrent use and do not block: every method is called on
// the request path.
type Fleet interface {
	// Candidates appends to dst the healthy backends that serve model, in
	// fleet order, and returns the extended slice.
	Candidates(dst []*fleet.Backend, model string) []*fleet.Backend
	// Healthy appends to dst the healthy backends, in fleet order.
	Healthy(dst []*fleet.Backend) []*fleet.Backend
	// Models returns the models the backends serve.
	Models() []string
	// Ready reports whether the fleet can serve: discovery is done and some
	// backend is healthy.
	Ready() bool
	// MarkFailed takes b out of rotation at once after a request to it
	// failed with err (a passive health check).
	MarkFailed(b *fleet.Backend, err error)
	// Report tells the fleet how an attempt at b went (outlier ejection).
	Report(b *fleet.Backend, r fleet.Result)
	// Backoff keeps b out of the candidates until then (a 429's
	// Retry-After).
	Backoff(b *fleet.Backend, until time.Time)
	// Backends returns every backend, healthy or not, in fleet order.
	Backends() []*fleet.Backend
}

// Config configures a Proxy. Fleet and Router are required.
type Config struct {
	// Fleet is the set of backends.
	Fleet Fleet
	// Router routes each chat and completion request with its policy, and
	// is told every such request's outcome through its ticket.
	Router *router.Router
	// SessionHeader is the request header that carries a session key; it
	// takes precedence over the body's prompt_cache_key and user. Empty
	// means request.DefaultSessionHeader.
	SessionHeader string
	// Transport carries requests to the backends. Nil means a transport
	// tuned for many concurrent long streams to a few hosts (see
	// upstream.NewTransport). Plain-http requests through an *http.Transport
	// go by the lean path (upstream.Lean) unless StdlibUpstream is set.
	Transport http.RoundTripper
	// StdlibUpstream sends every request through Transport as it is, not
	// the lean path: the fallback should the lean path misbehave with some
	// backend.
	StdlibUpstream bool
	// NetConnIO reads and writes the sockets of the lean path, and the
	// server's client connections (internal/server), through net.Conn,
	// not with raw system calls (internal/rawsock): the fallback, and the
	// choice for a proxy that shares its CPUs with busier processes
	// (docs/operations.md, --netconn-io).
	NetConnIO bool
	// Registerer receives the proxy's metrics. Nil means a registry of the
	// proxy's own, served at /metrics with the Go and process collectors;
	// with a Registerer of its own the caller serves the metrics.
	Registerer prometheus.Registerer
	// Logger receives the proxy's logs: a Debug line per request, warnings
	// for backend failures. Nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock that times decisions, TTFT and latency. Nil means
	// time.Now.
	Now func() time.Time
	// Rand returns a uniform random int in [0, n); it breaks ties between
	// equally loaded backends. It must be safe for concurrent use. Nil means
	// math/rand/v2.IntN.
	Rand func(n int) int
	// MaxBodyBytes bounds a request body; larger ones get 413. Zero means
	// request.DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Resilience sets the timeouts and retries of requests to backends.
	Resilience Resilience
	// Overload sets the caps and the queue of generation requests.
	Overload Overload
	// Security is who may use the proxy and what reaches the backends
	// (security.go); the zero value is an open proxy.
	Security Security
	// Explain adds the policy's predictions to every routed response
	// (HeaderPredictedCached, HeaderPredictedTTFT), for a bench or an
	// operator checking them against what the backend reported. Off by
	// default: they tell a client what the fleet holds of its prompt, and
	// so of other clients' prompts.
	Explain bool
	// TracerProvider, when not nil, traces every proxied request
	// (tracing.go); nil means no tracing, at no cost.
	TracerProvider trace.TracerProvider
	// Disagg configures prefill/decode disaggregation (disagg.go).
	Disagg Disagg
}

// Proxy is the HTTP handler of the OpenAI API in front of the fleet. It is
// safe for concurrent use.
type Proxy struct {
	fleet  Fleet
	router *router.Router
	byLoad *router.Router // embeddings and other endpoints

	// disagg, prefillRouter and dmetrics drive the prefill legs (disagg.go).
	disagg        Disagg
	prefillRouter *router.Router
	dmetrics      *disaggMetrics

	res    Resilience
	budget retryBudget
	over   Overload
	queue  *admission.Controller
	// stop ends every attempt still in flight (Stop); draining makes
	// /readyz answer 503 (Drain).
	stop    context.Context
	stopAll context.CancelFunc
	// stopShards hold the attempts in flight, which Stop ends; an attempt
	// registers on one by a random pick: each registration takes its
	// shard's lock, which would otherwise be one lock for every attempt of
	// every core.
	stopShards [stopShardCount]stopShard
	draining   atomic.Bool
	// noContinue holds when each backend (*fleet.Backend) last refused to
	// continue a message: no stream is migrated to it for a while
	// (migrate.go).
	noContinue    sync.Map
	sessionHeader string
	transport     http.RoundTripper
	log           *slog.Logger
	now           func() time.Time
	rand          func(int) int
	maxBody       int64
	metrics       *metrics
	metricsPage   http.Handler // nil when the caller serves the metrics
	created       int64        // Unix seconds, for /v1/models
	sec           *security
	tracer        trace.Tracer // tracing.go; nil: off
	explain       bool         // Config.Explain

	reg prometheus.Registerer // where the metrics are registered (Registerer)
}

var _ http.Handler = (*Proxy)(nil)

// New returns a Proxy for cfg. It is long only because it takes Config's
// fields one by one, each with its default or registration.
func New(cfg Config) (*Proxy, error) {
	if cfg.Fleet == nil {
		return nil, errors.New("proxy: Config.Fleet is required")
	}
	if cfg.Router == nil {
		return nil, errors.New("proxy: Config.Router is required")
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, errors.New("proxy: Config.MaxBodyBytes must not be negative")
	}
	p := &Proxy{
		fleet:         cfg.Fleet,
		router:        cfg.Router,
		sessionHeader: http.CanonicalHeaderKey(cmp.Or(cfg.SessionHeader, request.DefaultSessionHeader)), // else Header.Get makes it, every request
		transport:     cfg.Transport,
		log:           cfg.Logger,
		now:           cfg.Now,
		rand:          cfg.Rand,
		maxBody:       cfg.MaxBodyBytes,
		explain:       cfg.Explain,
	}
	if p.transport == nil {
		p.transport = upstream.NewTransport()
	}
	if t, ok := p.transport.(*http.Transport); ok && !cfg.StdlibUpstream {
		if lean := upstream.NewLean(t, !cfg.NetConnIO); lean != nil {
			p.transport = lean
		}
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	if p.now == nil {
		p.now = time.Now
	}
	if p.rand == nil {
		p.rand = rand.IntN
	}
	if p.maxBody == 0 {
		p.maxBody = request.DefaultMaxBodyBytes
	}
	// Requests that are not chat or completions go to the least loaded
	// candidate, ties broken by Config.Rand.
	p.byLoad = router.NewRouter(baseline.NewLeastRequestRand(p.rand), nil)
	p.prefillRouter = router.NewRouter(baseline.NewLeastRequestRand(p.rand), nil)
	p.disagg = cfg.Disagg.withDefaults()
	p.res = cfg.Resilience.withDefaults()
	p.budget.ratio, p.budget.min, p.budget.now = p.res.RetryBudget, int64(p.res.RetryBudgetMin), p.now
	p.stop, p.stopAll = context.WithCancel(context.Background())
	for i := range p.stopShards {
		p.stopShards[i].live = make(map[*attempt]struct{}, 64)
	}
	p.over = cfg.Overload
	if p.over.MaxPerBackend == 0 {
		p.over.MaxPerBackend = admission.DefaultMaxPerBackend
	}
	reg := cfg.Registerer
	if reg == nil {
		own := prometheus.NewRegistry()
		own.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		p.metricsPage = promhttp.HandlerFor(own, promhttp.HandlerOpts{})
		reg = own
	}
	p.reg = reg
	var err error
	if p.metrics, err = newMetrics(reg, cfg.Fleet); err != nil {
		return nil, err
	}
	if p.dmetrics, err = newDisaggMetrics(reg); err != nil {
		return nil, err
	}
	if lean, ok := p.transport.(*upstream.Lean); ok {
		lean.CountOn(p.metrics.upstream)
	}
	// A fleet that reports on its backends (health, ejections) has its
	// metrics served beside the proxy's.
	if c, ok := cfg.Fleet.(interface{ Collector() prometheus.Collector }); ok {
		if err := reg.Register(c.Collector()); err != nil {
			return nil, fmt.Errorf("proxy: register the fleet's metrics: %w", err)
		}
	}
	if c := cfg.Router.Collector(); c != nil { // predictions, response pins, the policy's own
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("proxy: register the router's metrics: %w", err)
		}
	}
	qc := p.over.Admission
	if qc.Registerer == nil {
		qc.Registerer = reg
	}
	if p.queue, err = admission.New(qc); err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	if p.sec, err = newSecurity(cfg.Security, reg, p.log); err != nil {
		return nil, err
	}
	p.created = p.now().Unix()
	p.tracer = newTracer(cfg.TracerProvider)
	return p, nil
}

// ServeHTTP routes r to its endpoint.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tagRequest(w, r) // requestid.go: X-Request-Id
	defer p.traceRequest(&w, &r)()
	if messagesPath(r.URL.Path) {
		w = &messagesWriter{w} // messages.go: kvroute's errors in Anthropic's shape
	}
	var ok bool
	if r, ok = p.admit(w, r); !ok { // security.go: path, key, allow-list, rate
		return
	}
	path := r.URL.Path
	switch path {
	case "/v1/chat/completions":
		if p.allow(w, r, http.MethodPost) {
			p.serveGeneration(w, r, request.Chat)
		}
	case "/v1/completions":
		if p.allow(w, r, http.MethodPost) {
			p.serveGeneration(w, r, request.Completion)
		}
	case "/v1/responses":
		if p.allow(w, r, http.MethodPost) {
			p.serveGeneration(w, r, request.Responses)
		}
	case "/v1/messages":
		if p.allow(w, r, http.MethodPost) {
			p.serveGeneration(w, r, request.Messages)
		}
	case "/v1/embeddings":
		if p.allow(w, r, http.MethodPost) {
			p.serveByLoad(w, r, request.Embedding)
		}
	case "/v1/models":
		if p.allow(w, r, http.MethodGet, http.MethodHead) {
			p.serveModels(w)
		}
	case "/healthz", "/health": // /health as vLLM and llama-server name it
		if p.allow(w, r, http.MethodGet, http.MethodHead) {
			writeText(w, http.StatusOK, "ok\n")
		}
	case "/readyz":
		if p.allow(w, r, http.MethodGet, http.MethodHead) {
			if p.fleet.Ready() && !p.draining.Load() {
				writeText(w, http.StatusOK, "ready\n")
			} else {
				writeError(w, p.notReady())
			}
		}
	case "/metrics":
		if p.metricsPage == nil {
			p.reject(w, notFound(r))
		} else if p.allow(w, r, http.MethodGet, http.MethodHead) {
			p.metricsPage.ServeHTTP(w, r)
		}
	default:
		if strings.HasPrefix(path, "/v1/") {
			p.serveByLoad(w, r, request.Other)
		} else {
			p.reject(w, notFound(r))
		}
	}
}

// Drain makes /readyz answer 503 from now on, so that the load balancer in
// front stops sending new requests; the proxy still serves what comes.
func (p *Proxy) Drain() { p.draining.Store(true) }

func (p *Proxy) notReady() *apiError {
	if p.draining.Load() {
		return openai.Unavailable("kvroute is draining")
	}
	return openai.Unavailable("no backend is ready")
}

// Stop ends every request still in flight: a stream under way ends with an
// error event, a request not yet answered gets 503. Requests that come after
// get the same 503 at once. Call it when the shutdown grace has run out.
func (p *Proxy) Stop() {
	p.stopAll()
	for i := range p.stopShards {
		p.stopShards[i].stop()
	}
}

// stopShardCount is the number of stopShards: more than the cores that
// contend for them.
const stopShardCount = 32

// stopShard returns a shard for one attempt to register on.
func (p *Proxy) stopShard() *stopShard {
	return &p.stopShards[rand.Uint32()%stopShardCount]
}

// stopShard is a set of attempts in flight that Stop ends. Registering
// allocates nothing, where context.AfterFunc on a context Stop cancels made
// three allocations an attempt.
type stopShard struct {
	mu      sync.Mutex
	stopped bool
	live    map[*attempt]struct{}
	_       [40]byte // a cache line each: the shards are for cores not to share one
}

// add registers a until remove; after stop, it ends a at once.
func (s *stopShard) add(a *attempt) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		a.cancel(errShutdown)
		return
	}
	s.live[a] = struct{}{}
}

func (s *stopShard) remove(a *attempt) {
	s.mu.Lock()
	delete(s.live, a)
	s.mu.Unlock()
}

// stop ends the attempts registered and every one that registers after.
func (s *stopShard) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	for a := range s.live {
		a.cancel(errShutdown)
	}
}

// Registerer is where the proxy's metrics are registered: its own registry
// or Config.Registerer. Parts started beside the proxy register theirs
// here, to be served with them.
func (p *Proxy) Registerer() prometheus.Registerer { return p.reg }
