package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/upstream"
)

// These tests follow the proxy's requests onto its upstream connections:
// the lean path (internal/upstream) as the proxy drives it.

// connServer is a backend that records the client address of every request
// and the connections it saw closed.
type connServer struct {
	*httptest.Server
	mu     sync.Mutex
	addrs  []string
	closed chan string // remote address of each connection closed
}

func newConnServer(t *testing.T, h http.HandlerFunc) *connServer {
	t.Helper()
	s := &connServer{closed: make(chan string, 100)}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.addrs = append(s.addrs, r.RemoteAddr)
		s.mu.Unlock()
		h(w, r)
	}))
	s.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			s.closed <- c.RemoteAddr().String()
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func (s *connServer) remoteAddrs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.addrs...)
}

// awaitClosed waits until the server saw the connection from addr closed.
func (s *connServer) awaitClosed(t *testing.T, addr string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case a := <-s.closed:
			if a == addr {
				return
			}
		case <-timeout:
			t.Fatalf("the backend's connection from %s was not closed", addr)
		}
	}
}

// streamEvents streams n content events and the end marker.
func streamEvents(n int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for range n {
			_, _ = io.WriteString(w, `data: {"choices":[{"delta":{"content":"x"}}]}`+"\n\n")
			_ = http.NewResponseController(w).Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}
}

func leanOf(t *testing.T, p *Proxy) *upstream.Lean {
	t.Helper()
	lt, ok := p.transport.(*upstream.Lean)
	if !ok {
		t.Fatalf("the proxy's transport is %T, not the lean path", p.transport)
	}
	return lt
}

// Streams read to their end leave their connection to the next request, on
// the lean path as through net/http's transport.
func TestUpstreamReusesConnectionAfterCompleteStream(t *testing.T) {
	for _, stdlib := range []bool{false, true} {
		name := map[bool]string{false: "lean", true: "stdlib"}[stdlib]
		t.Run(name, func(t *testing.T) {
			be := newConnServer(t, streamEvents(3))
			b0 := testBackend(t, 0, "b0", be.URL, "m")
			p, px := newTestProxy(t, newFakeFleet(b0), newFirstPolicy(), func(c *Config) { c.StdlibUpstream = stdlib })
			for range 3 {
				res, body := post(t, px.URL, "/v1/chat/completions", streamBody)
				if res.StatusCode != 200 || strings.Count(body, "data: ") != 4 {
					t.Fatalf("status %d, body %q", res.StatusCode, body)
				}
				px.await(t)
			}
			addrs := be.remoteAddrs()
			if addrs[0] != addrs[1] || addrs[1] != addrs[2] {
				t.Errorf("the backend saw the requests from %v: want one connection", addrs)
			}
			if _, isLean := p.transport.(*upstream.Lean); isLean == stdlib {
				t.Errorf("transport %T with StdlibUpstream %v", p.transport, stdlib)
			}
			if !stdlib {
				if n := leanOf(t, p).IdleConns(); n != 1 {
					t.Errorf("%d idle connections pooled, want 1", n)
				}
				for event, want := range map[string]float64{"dialed": 1, "reused": 2, "closed_early": 0} {
					if got := counterValue(t, p, "kvroute_upstream_connections_total", "event", event); got != want {
						t.Errorf("upstream_connections_total{event=%s} = %v, want %v", event, got, want)
					}
				}
			}
		})
	}
}

// A client that goes away mid-stream ends the upstream request: its
// connection is closed, not pooled half-read, and the next request dials
// anew.
func TestUpstreamClientCancelClosesConnection(t *testing.T) {
	release := make(chan struct{})
	var calls sync.WaitGroup
	calls.Add(1)
	be := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("X-Test"), "second") {
			streamEvents(1)(w, r)
			return
		}
		defer calls.Done()
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"choices":[{"delta":{"content":"Hi"}}]}`+"\n\n")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	b0 := testBackend(t, 0, "b0", be.URL, "m")
	p, px := newTestProxy(t, newFakeFleet(b0), newFirstPolicy(), nil)
	lt := leanOf(t, p)

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, px.URL+"/v1/chat/completions", strings.NewReader(streamBody))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	event(t, bufio.NewReader(res.Body))
	cancel()
	res.Body.Close()
	be.awaitClosed(t, be.remoteAddrs()[0])
	px.await(t)
	calls.Wait()
	if n := lt.IdleConns(); n != 0 {
		t.Errorf("%d idle connections pooled after a cancelled stream, want 0", n)
	}
	if got := counterValue(t, p, "kvroute_upstream_connections_total", "event", "closed_early"); got != 1 {
		t.Errorf("upstream_connections_total{event=closed_early} = %v, want 1", got)
	}

	res, body := post(t, px.URL, "/v1/chat/completions", streamBody, "X-Test", "second")
	if res.StatusCode != 200 || !strings.Contains(body, "[DONE]") {
		t.Fatalf("status %d, body %q", res.StatusCode, body)
	}
	if addrs := be.remoteAddrs(); addrs[0] == addrs[1] {
		t.Errorf("the second request went on the cancelled stream's connection %s", addrs[0])
	}
}

// A pooled connection the backend closed while idle fails before its first
// byte; the request goes again on a new connection and the client sees
// nothing of it.
func TestUpstreamRetriesConnectionClosedWhileIdle(t *testing.T) {
	be := newConnServer(t, streamEvents(2))
	b0 := testBackend(t, 0, "b0", be.URL, "m")
	p, px := newTestProxy(t, newFakeFleet(b0), newFirstPolicy(), nil)
	lt := leanOf(t, p)
	if res, _ := post(t, px.URL, "/v1/chat/completions", streamBody); res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	px.await(t)
	first := be.remoteAddrs()[0]
	if lt.IdleConns() != 1 {
		t.Fatalf("%d idle connections, want 1", lt.IdleConns())
	}
	be.CloseClientConnections()
	be.awaitClosed(t, first)

	res, body := post(t, px.URL, "/v1/chat/completions", streamBody)
	if res.StatusCode != 200 || strings.Count(body, "data: ") != 3 {
		t.Fatalf("status %d, body %q", res.StatusCode, body)
	}
	if got := counterValue(t, p, "kvroute_requests_total", "backend", "b0", "status", "200"); got != 2 {
		t.Errorf("requests_total{status=200} = %v, want 2", got)
	}
	if got := counterValue(t, p, "kvroute_upstream_connections_total", "event", "resent"); got != 1 {
		t.Errorf("upstream_connections_total{event=resent} = %v, want 1", got)
	}
}
