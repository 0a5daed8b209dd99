package epp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/policies"
	"github.com/kvroute/kvroute/internal/server"
)

// The tests of this file each check one point of the endpoint picker
// protocol (GIE docs/proposals/004-endpoint-picker-protocol) or of the
// extension's conformance suite (GIE conformance/tests), through the real
// gRPC stream; docs/epp.md lists them point by point.

// TestConformanceHeaderEqualsMetadata: "The EPP MUST not set two different
// values in the header and the inner response metadata value." By default
// both carry the chosen endpoint and its fallbacks; OriginalDstHeader
// departs from it on purpose, for ORIGINAL_DST clusters.
func TestConformanceHeaderEqualsMetadata(t *testing.T) {
	ctx := t.Context()
	bs := emulators(t, ctx, 3)
	for _, tt := range []struct {
		name              string
		opts              Options
		wantList, wantHdr int
	}{
		{"default fallbacks", Options{Fallbacks: 2}, 3, 3},
		{"no fallbacks", Options{}, 1, 1},
		{"more fallbacks than endpoints", Options{Fallbacks: 5}, 3, 3},
		{"ORIGINAL_DST header", Options{Fallbacks: 2, OriginalDstHeader: true}, 3, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, env := startPicker(t, ctx, bs, "kvroute", tt.opts)
			env.originalDst = tt.opts.OriginalDstHeader // else the harness fails on any difference
			for _, path := range []string{"/v1/chat/completions", "/v1/models"} {
				var body []byte
				env.method = http.MethodGet
				if path == "/v1/chat/completions" {
					body, env.method = chatBody(model(bs), []message{{"user", "hello"}}, 4), http.MethodPost
				}
				res, err := env.do(ctx, path, nil, body)
				if err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				// A request the policy does not route names one endpoint.
				wantList, wantHdr := tt.wantList, tt.wantHdr
				if body == nil {
					wantList, wantHdr = 1, 1
				}
				if len(res.list) != wantList || len(strings.Split(res.dest, ",")) != wantHdr {
					t.Errorf("%s: header %q, metadata %q: want %d in the header and %d in the metadata", path, res.dest, res.list, wantHdr, wantList)
				}
			}
		})
	}
}

// TestConformanceSubsetHint: with envoy.lb.subset_hint /
// x-gateway-destination-endpoint-subset set, the picker "MUST only select
// endpoints from the specified list"; an empty list, or one with no
// eligible endpoint, gets an immediate 503. The list may be a list value or
// one comma-separated string, and an entry without a port admits every
// port of its IP (GIE lwepp handlers/request.go reads it so).
func TestConformanceSubsetHint(t *testing.T) {
	ctx := t.Context()
	bs := emulators(t, ctx, 4)
	_, env := startPicker(t, ctx, bs, "round-robin", Options{Fallbacks: 2})
	all := env.pool
	a := func(i int) string { return Address(bs[i]) }
	host, _, _ := net.SplitHostPort(a(0))
	for _, tt := range []struct {
		name   string
		subset any
		want   []string // nil: an immediate 503
	}{
		{"one endpoint, list", []string{a(2)}, []string{a(2)}},
		{"two endpoints, comma-separated string", a(1) + ", " + a(3), []string{a(1), a(3)}},
		{"two endpoints, list", []string{a(0), a(3)}, []string{a(0), a(3)}},
		{"IP without port", []string{host}, []string{a(0), a(1), a(2), a(3)}},
		{"empty list", []string{}, nil},
		{"no eligible endpoint", []string{"192.0.2.1:8000"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env.subset, env.pool = tt.subset, map[string]bool{}
			for _, w := range tt.want {
				env.pool[w] = true // the harness fails on a destination outside it
			}
			defer func() { env.subset, env.pool = nil, all }()
			seen := map[string]bool{}
			for i := range 2 * len(all) {
				for _, get := range []bool{false, true} {
					path, body := "/v1/chat/completions", chatBody(model(bs), []message{{"user", fmt.Sprintf("subset %d", i)}}, 4)
					env.method = http.MethodPost
					if get {
						path, body, env.method = "/v1/models", nil, http.MethodGet
					}
					res, err := env.do(ctx, path, nil, body)
					if err != nil {
						t.Fatalf("%s: %v", path, err)
					}
					if tt.want == nil {
						if !res.immediate || res.status != http.StatusServiceUnavailable {
							t.Fatalf("%s: status %d (immediate %v), want an immediate 503", path, res.status, res.immediate)
						}
						continue
					}
					if res.status != http.StatusOK {
						t.Fatalf("%s: status %d: %s", path, res.status, res.body)
					}
					if !get {
						seen[res.list[0]] = true
						if len(res.list) != min(len(tt.want), 3) {
							t.Errorf("destination list %q: want every fallback within the subset", res.list)
						}
					}
				}
			}
			if tt.want != nil && !maps.Equal(seen, env.pool) {
				t.Errorf("round-robin within the subset chose %v, want each of %v", slices.Sorted(maps.Keys(seen)), tt.want)
			}
		})
	}
}

// deadBackend is a backend whose address refuses connections: an endpoint
// that is not ready.
func deadBackend(t *testing.T, i int) *fleet.Backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	b, err := fleet.ParseBackend(i, fmt.Sprintf("dead%d=http://%s", i, addr))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestConformanceNoReadyEndpointIs503: "ImmediateResponse with 503 (Service
// Unavailable) HTTP status code if there are no ready endpoints", for
// generation requests and the others alike; the picker stays ready to say
// so (TestConformanceHealthServices).
func TestConformanceNoReadyEndpointIs503(t *testing.T) {
	ctx := t.Context()
	bs := []*fleet.Backend{deadBackend(t, 0), deadBackend(t, 1)}
	s, env := startPicker(t, ctx, bs, "kvroute", Options{Fallbacks: 2})
	if s.Fleet.Ready() {
		t.Fatal("an endpoint that refuses connections is in rotation")
	}
	for _, tt := range []struct {
		method, path string
		body         []byte
	}{
		{http.MethodPost, "/v1/chat/completions", chatBody("m", []message{{"user", "hi"}}, 4)},
		{http.MethodPost, "/v1/completions", []byte(`{"model":"m","prompt":"hi"}`)},
		{http.MethodGet, "/v1/models", nil},
	} {
		env.method = tt.method
		res, err := env.do(ctx, tt.path, nil, tt.body)
		if err != nil {
			t.Fatalf("%s: %v", tt.path, err)
		}
		if !res.immediate || res.status != http.StatusServiceUnavailable || res.retryAfter == "" {
			t.Errorf("%s: status %d (immediate %v, Retry-After %q), want an immediate 503 with Retry-After", tt.path, res.status, res.immediate, res.retryAfter)
		}
	}
}

// TestConformanceSheddingIs429: "ImmediateResponse with 429 (Too Many
// Requests) HTTP status code if the request should be dropped": a request
// the admission queue refuses while every endpoint is full.
func TestConformanceSheddingIs429(t *testing.T) {
	ctx := t.Context()
	bs := emulators(t, ctx, 1)
	_, env := startPicker(t, ctx, bs, "kvroute", Options{MaxPerEndpoint: 1, Admission: admissionNoQueue()})
	stop := holdRequest(t, env, model(bs))
	defer stop()
	for _, class := range []string{"", "sheddable"} {
		h := map[string]string{}
		if class != "" {
			h["x-kvroute-priority"] = class
		}
		res, err := env.do(ctx, "/v1/chat/completions", h, chatBody(model(bs), []message{{"user", "hi"}}, 4))
		if err != nil {
			t.Fatal(err)
		}
		if !res.immediate || res.status != http.StatusTooManyRequests || res.retryAfter == "" {
			t.Errorf("class %q: status %d (immediate %v, Retry-After %q), want an immediate 429 with Retry-After", class, res.status, res.immediate, res.retryAfter)
		}
	}
}

// TestConformanceEndpointServed: on the response path Envoy reports
// envoy.lb / x-gateway-destination-endpoint-served. When it names a
// fallback, the chosen endpoint failed: its ticket ends as a failure (the
// load is released at once) and the outcome is counted served_by_fallback;
// when it names the chosen one, nothing of the sort.
func TestConformanceEndpointServed(t *testing.T) {
	ctx := t.Context()
	bs := emulators(t, ctx, 3)
	s, env := startPicker(t, ctx, bs, "kvroute", Options{Fallbacks: 2})
	byFallback := s.Picker.metrics.requests.WithLabelValues("served_by_fallback")
	for _, tt := range []struct {
		name  string
		serve func([]string) string
		want  float64 // served_by_fallback after it
	}{
		{"the chosen endpoint", nil, 0},
		{"the first fallback", func(l []string) string { return l[1] }, 1},
		{"the last fallback", func(l []string) string { return l[len(l)-1] }, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env.serve = tt.serve
			defer func() { env.serve = nil }()
			res, err := env.do(ctx, "/v1/chat/completions", nil, chatBody(model(bs), []message{{"user", "served by " + tt.name}}, 4))
			if err != nil {
				t.Fatal(err)
			}
			if res.status != http.StatusOK {
				t.Fatalf("status %d: %s", res.status, res.body)
			}
			if got := testutil.ToFloat64(byFallback); got != tt.want {
				t.Errorf("served_by_fallback %v, want %v", got, tt.want)
			}
			for _, b := range bs {
				if l := b.Load(); l.Requests != 0 {
					t.Errorf("%s: %d requests still counted in flight", b.Name, l.Requests)
				}
			}
		})
	}
}

// healthOf asks the picker's gRPC health service for service's status.
func healthOf(ctx context.Context, hc healthpb.HealthClient, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	return r.GetStatus(), err
}

// TestConformanceHealthServices: the gRPC health services liveness,
// readiness and envoy.service.ext_proc.v3.ExternalProcessor (and "", the
// server's). Readiness means synced, not "an endpoint is ready": with none
// ready the picker must stay reachable to answer 503. On shutdown every
// service but liveness turns NOT_SERVING before the streams are drained.
func TestConformanceHealthServices(t *testing.T) {
	ctx := t.Context()
	services := []string{"", "liveness", "readiness", extprocv3.ExternalProcessor_ServiceDesc.ServiceName}
	for _, tt := range []struct {
		name string
		bs   func() []*fleet.Backend
	}{
		{"endpoints ready", func() []*fleet.Backend { return emulators(t, ctx, 1) }},
		{"no endpoint ready", func() []*fleet.Backend { return []*fleet.Backend{deadBackend(t, 0)} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bs := tt.bs()
			s, env := startPicker(t, ctx, bs, "kvroute", Options{})
			conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			hc := healthpb.NewHealthClient(conn)
			for _, name := range services {
				if st, err := healthOf(ctx, hc, name); err != nil || st != healthpb.HealthCheckResponse_SERVING {
					t.Errorf("health %q: %v, %v; want SERVING", name, st, err)
				}
			}
			if !s.Fleet.Ready() {
				return // nothing to hold open for the drain below
			}
			// Shutdown with a stream open: the watch sees readiness go
			// NOT_SERVING while the stream drains.
			wctx, unwatch := context.WithCancel(ctx)
			defer unwatch()
			watch, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{Service: "readiness"})
			if err != nil {
				t.Fatal(err)
			}
			if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("watch: %v, %v", r.GetStatus(), err)
			}
			stop := holdRequest(t, env, model(bs))
			done := make(chan struct{})
			go func() {
				gctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				s.Shutdown(gctx)
				close(done)
			}()
			if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
				t.Errorf("readiness during the drain: %v, %v; want NOT_SERVING", r.GetStatus(), err)
			}
			// The drain waits for open streams (the watch is one), then
			// ends.
			unwatch()
			stop()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Error("the drain did not end when its last stream did")
			}
		})
	}
}

// failingPolicy is a policy that always fails, as a bug would.
type failingPolicy struct{}

func (failingPolicy) Name() string { return "failing" }
func (failingPolicy) Pick(*router.Request, []*fleet.Backend) (router.Decision, error) {
	return router.Decision{}, errors.New("out of order")
}

// TestConformanceFailOpen: an InferencePool's FailOpen is Envoy's
// failure_mode_allow, which lets a request through without the picker when
// "the gRPC stream cannot be established" or "is closed prematurely with
// an error" (ext_proc.proto). So the picker ends the stream with a gRPC
// error, not a local 500, when it fails itself (the gateway then routes
// the request), keeps the immediate responses for what the protocol
// defines (503, 429: TestConformanceNoReadyEndpointIs503,
// TestConformanceSheddingIs429), and once shut down refuses new streams.
func TestConformanceFailOpen(t *testing.T) {
	ctx := t.Context()
	bs := emulators(t, ctx, 1)
	t.Run("the policy fails", func(t *testing.T) {
		fl := fleet.New(bs, fleet.Options{})
		fl.Refresh(ctx)
		pk, err := New(Options{Fleet: fl, Router: router.NewRouter(failingPolicy{}, nil), Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		extprocv3.RegisterExternalProcessorServer(gs, pk)
		go gs.Serve(ln)
		defer gs.Stop()
		env := connect(t, &Server{Addr: ln.Addr().String()})
		env.pool[Address(bs[0])] = true
		_, err = env.do(ctx, "/v1/chat/completions", nil, chatBody(model(bs), []message{{"user", "hi"}}, 4))
		if status.Code(err) != codes.Internal {
			t.Errorf("stream ended with %v, want a gRPC Internal error (Envoy's failure mode decides)", err)
		}
		if n := bs[0].Load().Requests; n != 0 {
			t.Errorf("%d requests counted in flight after the failure", n)
		}
	})
	t.Run("the picker is shut down", func(t *testing.T) {
		s, env := startPicker(t, ctx, bs, "kvroute", Options{})
		res, err := env.do(ctx, "/v1/chat/completions", nil, chatBody(model(bs), []message{{"user", "hi"}}, 4))
		if err != nil || res.status != http.StatusOK {
			t.Fatalf("before the shutdown: status %d, %v", res.status, err)
		}
		s.Shutdown(ctx)
		st, err := env.ext.Process(ctx)
		if err == nil {
			err = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{hv(":method", "GET"), hv(":path", "/v1/models")}}, EndOfStream: true}}})
			if err == nil || errors.Is(err, io.EOF) {
				_, err = st.Recv()
			}
		}
		if status.Code(err) != codes.Unavailable {
			t.Errorf("a stream after the shutdown: %v, want a gRPC Unavailable error", err)
		}
	})
}

// inferencePoolPorts is inferencePool with several target ports: the
// data-parallel ranks of each pod.
func inferencePoolPorts(matchLabels map[string]any, ports ...int) *unstructured.Unstructured {
	u := inferencePool(matchLabels, ports[0])
	var tp []any
	for _, p := range ports {
		tp = append(tp, map[string]any{"number": int64(p)})
	}
	_ = unstructured.SetNestedSlice(u.Object, tp, "spec", "targetPorts")
	return u
}

// TestConformanceDataParallelPorts: an InferencePool with several
// targetPorts (a data-parallel server: one rank per port) makes each
// pod:port an endpoint of its own, and the picker balances across them
// (GIE conformance/tests/gateway_following_epp_routing_dp.go). A subset
// entry with an IP alone admits every rank of that pod; ip:port one rank.
func TestConformanceDataParallelPorts(t *testing.T) {
	if testing.Short() {
		t.Skip("runs emulators")
	}
	ctx := t.Context()
	ips, p1 := podEmulators(t, ctx, 2)
	ips2, p2 := podEmulators(t, ctx, 2)
	if !slices.Equal(ips, ips2) || p1 == p2 {
		t.Fatalf("emulators at %v:%d and %v:%d, want the same pods at two ports", ips, p1, ips2, p2)
	}
	dc := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{poolGVR: "InferencePoolList"}, inferencePoolPorts(map[string]any{"app": "vllm"}, p1, p2))
	labels := map[string]string{"app": "vllm"}
	cs := fake.NewClientset(modelPod("vllm-0", ips[0], labels, true, false), modelPod("vllm-1", ips[1], labels, true, false))
	d, err := discovery.New(discovery.Config{Logger: quiet(),
		Pool: &discovery.Pool{Namespace: "ai", Name: "llama", Dynamic: dc, Core: cs, Resync: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(ctx, Config{CoreConfig: server.CoreConfig{Discovery: d, Policy: "round-robin", Router: policies.Options{Seed: 1}, Logger: quiet()},
		Picker: Options{Fallbacks: 1}, GRPCListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	env := connect(t, s)
	ep := func(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }
	for _, ip := range ips {
		env.pool[ep(ip, p1)], env.pool[ep(ip, p2)] = true, true
	}
	for deadline := time.Now().Add(10 * time.Second); len(s.Fleet.Healthy(nil)) != 4; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d endpoints in rotation, want 2 pods × 2 ports", len(s.Fleet.Healthy(nil)))
		}
	}
	m := s.Fleet.Healthy(nil)[0].Info().Models[0]
	all := maps.Clone(env.pool)
	for _, tt := range []struct {
		name   string
		subset any
		want   []string
	}{
		{"the whole pool", nil, slices.Collect(maps.Keys(all))},
		{"one pod, any rank", []string{ips[0]}, []string{ep(ips[0], p1), ep(ips[0], p2)}},
		{"one pod, one rank", []string{ep(ips[1], p2)}, []string{ep(ips[1], p2)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env.subset, env.pool = tt.subset, map[string]bool{}
			for _, w := range tt.want {
				env.pool[w] = true
			}
			seen := map[string]bool{}
			for i := range 3 * len(tt.want) {
				res, err := env.do(ctx, "/v1/chat/completions", nil, chatBody(m, []message{{"user", fmt.Sprintf("rank %d", i)}}, 4))
				if err != nil {
					t.Fatal(err)
				}
				if res.status != http.StatusOK {
					t.Fatalf("status %d: %s", res.status, res.body)
				}
				seen[res.list[0]] = true
			}
			if !maps.Equal(seen, env.pool) {
				t.Errorf("requests went to %v, want each of %v", slices.Sorted(maps.Keys(seen)), slices.Sorted(slices.Values(tt.want)))
			}
		})
	}
}
