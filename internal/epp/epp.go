// Package epp is kvroute's endpoint picker for the Gateway API Inference
// Extension: an Envoy external processor (envoy.service.ext_proc.v3) that
// routes each request with a router.Router, as `kvroute serve` does, and
// tells Envoy where to send it, while Envoy carries the bytes.
//
// One gRPC stream is one HTTP request. In the FULL_DUPLEX_STREAMED body mode
// Envoy sends the request headers, then the body in chunks without waiting;
// the picker holds its header reply until the body's end_of_stream, parses
// the body, routes, and answers with the header x-gateway-destination-endpoint
// and the envoy.lb dynamic metadata, then the body back as
// StreamedBodyResponse chunks. On the response path it echoes every body
// chunk unchanged, watching for the first token and the usage, and finishes
// the routing ticket at the end of the stream, so that the policy learns
// from the same outcomes as behind the proxy.
package epp

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/router"
)

// The endpoint picker protocol's names (GIE docs/proposals/004-endpoint-
// picker-protocol; pkg/lwepp/metadata/consts.go).
const (
	// HeaderDestination is the request header, and the key in the
	// MetadataNamespace dynamic metadata, naming the endpoints Envoy should
	// send the request to: ip:port, or an ordered list ip:port,ip:port,…
	HeaderDestination = "x-gateway-destination-endpoint"
	// MetadataNamespace is the dynamic metadata namespace of the
	// destination, and of the endpoint that served it on the response path.
	MetadataNamespace = "envoy.lb"
	// KeyServed is the key under MetadataNamespace in the response path's
	// metadata_context where Envoy reports the endpoint that served the
	// request (it may be a fallback).
	KeyServed = "x-gateway-destination-endpoint-served"
	// SubsetNamespace and KeySubset carry, in the request's
	// metadata_context, the endpoints Envoy allows this request to go to.
	SubsetNamespace = "envoy.lb.subset_hint"
	KeySubset       = "x-gateway-destination-endpoint-subset"
	// HeaderFairnessID names a request's fairness flow; the picker uses it
	// as the admission tenant when X-Kvroute-Tenant is absent.
	HeaderFairnessID = "x-gateway-inference-fairness-id"
)

// Defaults of Options.
const (
	// DefaultMaxBodyBytes bounds a request body, as the proxy does.
	DefaultMaxBodyBytes = request.DefaultMaxBodyBytes
	// DefaultMaxPerEndpoint is the proxy's per-backend cap: vLLM's
	// max_num_seqs, past which an engine only queues.
	DefaultMaxPerEndpoint = admission.DefaultMaxPerBackend
	// chunkBytes bounds one StreamedBodyResponse: Envoy recommends at most
	// 64 KiB; llm-d sends 62,000 bytes for a margin.
	chunkBytes = 62_000
	// responseBodyLimit bounds the non-streamed response body kept to read
	// its usage; a larger one is passed on without being read.
	responseBodyLimit = 8 << 20
)

// Options configure a Picker. Fleet and Router are required.
type Options struct {
	// Fleet is the pool of endpoints; its Candidates are what the picker
	// chooses from. The caller keeps it current (fleet.Run).
	Fleet *fleet.Fleet
	// Router drives the policy.
	Router *router.Router
	// Admission configures the queue in front of the endpoints (see the
	// admission package): what cannot run waits there, or is refused with
	// 429 and Retry-After. Its Registerer gets its metrics.
	Admission admission.Config
	// MaxPerEndpoint is the most generation requests in flight on one
	// endpoint (default DefaultMaxPerEndpoint; negative: no cap).
	MaxPerEndpoint int
	// Fallbacks is how many endpoints follow the chosen one in the
	// destination list, next-best first, for Envoy to retry on (0: none).
	Fallbacks int
	// OriginalDstHeader puts only the chosen endpoint in the header while
	// the metadata carries the whole list: Envoy's ORIGINAL_DST cluster
	// reads the header as one address and knows no fallbacks. The
	// protocol says header and metadata MUST NOT differ, so by default
	// both carry the list; with this set they differ whenever Fallbacks
	// is above 0 (docs/epp.md, "The header and the metadata").
	OriginalDstHeader bool
	// SessionHeader carries the session key (default X-Session-ID).
	SessionHeader string
	// IncludeUsage asks the backend for the usage chunk of streamed
	// responses that did not (stream_options.include_usage), so that the
	// policy learns the cached tokens; the client then sees that chunk.
	IncludeUsage bool
	// MaxBodyBytes bounds a request body (default DefaultMaxBodyBytes);
	// larger ones get 413.
	MaxBodyBytes int64
	// Logger receives refusals and stream errors; nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock of TTFT and latency; nil means time.Now.
	Now func() time.Time
	// Splitter decides which requests to endpoints of role decode or both
	// are prefilled first on a prefill endpoint, named to llm-d's sidecar
	// in HeaderPrefiller (disagg.go); nil never splits.
	Splitter router.Splitter
}

// Picker is the ext_proc service. Safe for concurrent use: each stream has
// its own state; what streams share (the fleet, the router, the admission
// queue, the metrics) is safe for concurrent use.
type Picker struct {
	extprocv3.UnimplementedExternalProcessorServer

	fleet   *fleet.Fleet
	router  *router.Router
	queue   *admission.Controller
	opts    Options
	log     *slog.Logger
	now     func() time.Time
	metrics *metrics
	// prefillRouter counts the prefill legs (disagg.go).
	prefillRouter *router.Router
}

var _ extprocv3.ExternalProcessorServer = (*Picker)(nil)

// New returns a Picker for opts.
func New(opts Options) (*Picker, error) {
	if opts.Fleet == nil || opts.Router == nil {
		return nil, errors.New("epp: Options.Fleet and Options.Router are required")
	}
	if opts.MaxPerEndpoint == 0 {
		opts.MaxPerEndpoint = DefaultMaxPerEndpoint
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.SessionHeader == "" {
		opts.SessionHeader = request.DefaultSessionHeader
	}
	q, err := admission.New(opts.Admission)
	if err != nil {
		return nil, err
	}
	p := &Picker{fleet: opts.Fleet, router: opts.Router, queue: q, opts: opts,
		log: opts.Logger, now: opts.Now, metrics: newMetrics(opts.Admission.Registerer), prefillRouter: newPrefillRouter()}
	if p.log == nil {
		p.log = slog.Default()
	}
	if p.now == nil {
		p.now = time.Now
	}
	return p, nil
}

// Address is the ip:port Envoy connects to for backend b: its URL's host,
// with the scheme's port when the URL names none.
func Address(b *fleet.Backend) string {
	if b.URL.Port() != "" {
		return b.URL.Host
	}
	port := 80
	if b.URL.Scheme == "https" {
		port = 443
	}
	return net.JoinHostPort(b.URL.Hostname(), strconv.Itoa(port))
}

// Process serves one ext_proc stream: one HTTP request and its response.
func (p *Picker) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	x := &exchange{p: p, srv: srv, ctx: srv.Context()}
	p.metrics.streams.Inc()
	defer p.metrics.streams.Dec()
	defer x.abandon()
	for {
		req, err := srv.Recv()
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
			return nil
		}
		if err != nil {
			return status.Errorf(codes.Unknown, "receive: %v", err)
		}
		done, err := x.handle(req)
		if err != nil {
			if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
				return err
			}
			return status.Errorf(codes.Unknown, "send: %v", err)
		}
		if done {
			return nil
		}
	}
}

// intN is the random source of ties between equally loaded endpoints.
func intN(n int) int { return rand.IntN(n) }
