package epp

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/server"
)

// DefaultGRPCListen is the GIE convention for the picker's port.
const DefaultGRPCListen = ":9002"

// Health service names the picker answers, as GIE's EPP does: the
// ext_proc service, liveness, readiness, and "" (the whole server).
var healthServices = []string{"", "liveness", "readiness", extprocv3.ExternalProcessor_ServiceDesc.ServiceName}

// Config describes an endpoint picker to start. Policy is required, and
// Backends or Discovery.
type Config struct {
	// CoreConfig is the fleet and the policy, as for `kvroute serve`: the
	// endpoints (Backends, whose URLs' host:port are what Envoy is told,
	// or Discovery: an InferencePool's pods, a Service's EndpointSlices,
	// DNS, a file), their health checks, the policy, the Logger.
	server.CoreConfig
	// Picker configures the picker; its Fleet and Router are filled in.
	Picker Options
	// GRPCListen is the ext_proc and health address (default :9002).
	GRPCListen string
	// MetricsListen, when not empty, serves /metrics on a listener of its
	// own.
	MetricsListen string
}

// Server is a running endpoint picker.
type Server struct {
	// Fleet, Router and Picker are the running parts.
	Fleet  *fleet.Fleet
	Router *router.Router
	Picker *Picker
	// Addr is the gRPC listener's address; MetricsURL the metrics
	// listener's base URL, if any.
	Addr, MetricsURL string

	grpc    *grpc.Server
	health  *health.Server
	metrics *http.Server
	cancel  context.CancelFunc
	run     *server.Group
	once    sync.Once
}

// Start builds the fleet, the router and the picker, checks every endpoint
// once, and serves ext_proc and gRPC health on GRPCListen. The fleet's
// loops run until Close or until ctx ends.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	cfg.Logger = log
	core, err := server.NewCore(ctx, cfg.CoreConfig)
	if err != nil {
		return nil, err
	}
	fl, rt := core.Fleet, core.Router
	// Until Run takes over the discovery, a failure below must stop its
	// informers.
	started := false
	defer func() {
		if !started && cfg.Discovery != nil {
			cfg.Discovery.Close()
		}
	}()
	reg := prometheus.NewRegistry()
	// The fleet's metrics (kvroute_backend_up, ejections, ...) and the
	// router's response pins, as serve exports them.
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), fl.Collector())
	if c := rt.Collector(); c != nil {
		reg.MustRegister(c)
	}
	po := cfg.Picker
	po.Fleet, po.Router, po.Logger, po.Admission.Registerer = fl, rt, log, reg
	pk, err := New(po)
	if err != nil {
		return nil, err
	}
	addr := cfg.GRPCListen
	if addr == "" {
		addr = DefaultGRPCListen
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, &server.ListenError{Listener: "gRPC", Err: err}
	}
	s := &Server{Fleet: fl, Router: rt, Picker: pk, Addr: ln.Addr().String(), run: server.NewGroup(grpc.ErrServerStopped)}
	var mln net.Listener
	if cfg.MetricsListen != "" {
		if mln, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			ln.Close()
			return nil, &server.ListenError{Listener: "metrics", Err: err}
		}
		s.MetricsURL = "http://" + mln.Addr().String()
	}

	ctx, s.cancel = context.WithCancel(ctx)
	started = true
	s.grpc = grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(s.grpc, pk)
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	core.Run(ctx, s.goRun)
	// NewCore has waited for the discovery's first lists and checked
	// every endpoint once: the picker is synced.
	s.setHealth(true)
	s.goRun(func() error { return s.grpc.Serve(ln) })
	if mln != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		s.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		s.goRun(func() error { return s.metrics.Serve(mln) })
	}
	return s, nil
}

// setHealth sets every health service but liveness to SERVING or
// NOT_SERVING; liveness stays SERVING while the process runs, so that a
// picker draining its streams is not restarted (llm-d-router's
// cmd/epp/runner/health.go does the same).
//
// Readiness does not follow the endpoints' health: the protocol makes it
// "the datastore has synced" (GIE docs/proposals/004-endpoint-picker-
// protocol, "Health Checking"), and a picker with no endpoint ready must
// stay reachable to answer the 503 the protocol asks for; taken out of
// its Service it would leave the gateway a 500 (FailClose) or no picker
// at all (FailOpen).
func (s *Server) setHealth(ready bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range healthServices {
		if name == "liveness" {
			s.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
			continue
		}
		s.health.SetServingStatus(name, st)
	}
}

func (s *Server) goRun(fn func() error) { s.run.Go(fn) }

// Err receives the first error a listener or the fleet's loop failed with.
func (s *Server) Err() <-chan error { return s.run.Err() }

// Shutdown stops the picker: health answers NOT_SERVING (liveness
// excepted, so that the draining process is not restarted), new streams
// are refused, and the streams open (requests in flight, whose responses the
// picker is echoing) get until ctx ends to finish; then they are cut. It
// waits for everything Start started.
func (s *Server) Shutdown(ctx context.Context) {
	s.once.Do(func() {
		s.setHealth(false)
		done := make(chan struct{})
		go func() { s.grpc.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			s.grpc.Stop()
			<-done
		}
		s.stopRest()
	})
}

// Close stops everything at once, cutting open streams, and waits for
// everything Start started.
func (s *Server) Close() {
	s.once.Do(func() {
		s.grpc.Stop()
		s.stopRest()
	})
}

func (s *Server) stopRest() {
	if s.metrics != nil {
		s.metrics.Close()
	}
	s.cancel()
	s.run.Wait()
}
