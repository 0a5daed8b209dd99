package upstream

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

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

// streamBody is a streamed chat request.
const streamBody = `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`

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

// A body closed before its end closes its connection; one read to its end
// pools it, unless the backend said it closes it.
func TestLeanBodyRelease(t *testing.T) {
	tests := []struct {
		name     string
		close    bool // the backend answers Connection: close
		readAll  bool
		wantIdle int
	}{
		{name: "read to the end", readAll: true, wantIdle: 1},
		{name: "closed early", readAll: false, wantIdle: 0},
		{name: "backend closes", close: true, readAll: true, wantIdle: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			be := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
				if tt.close {
					w.Header().Set("Connection", "close")
				}
				if tt.readAll {
					streamEvents(5)(w, r)
					return
				}
				// One event, and the rest of the stream later: nothing
				// is left buffered when the body is closed.
				streamEvents(1)(w, r)
				<-r.Context().Done()
			})
			lt := NewLean(NewTransport(), false)
			defer lt.CloseIdleConnections()
			req, _ := http.NewRequest(http.MethodPost, be.URL+"/v1/chat/completions", strings.NewReader(streamBody))
			res, err := lt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			if tt.readAll {
				_, err = io.Copy(io.Discard, res.Body)
			} else {
				_, err = res.Body.Read(make([]byte, 4096))
			}
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if n := lt.IdleConns(); n != tt.wantIdle {
				t.Errorf("%d idle connections, want %d", n, tt.wantIdle)
			}
			if tt.wantIdle == 0 {
				be.awaitClosed(t, be.remoteAddrs()[0])
			}
		})
	}
}

// The sweep closes the idle connections past the idle timeout and keeps
// the others.
func TestLeanSweepClosesExpired(t *testing.T) {
	be := newConnServer(t, streamEvents(1))
	lt := NewLean(NewTransport(), false)
	defer lt.CloseIdleConnections()
	var conns []*leanConn
	for range 2 {
		c, err := lt.conn(context.Background(), hostPort(strings.TrimPrefix(be.URL, "http://")))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		lt.put(c)
	}
	conns[0].idleSince = time.Now().Add(-2 * lt.idleFor) // the oldest
	local := conns[0].nc.LocalAddr().String()
	lt.sweep()
	if n := lt.IdleConns(); n != 1 {
		t.Fatalf("%d idle connections after the sweep, want 1", n)
	}
	if got := lt.get(conns[1].key); got != conns[1] {
		t.Errorf("the sweep kept %v, want the fresh connection", got)
	}
	be.awaitClosed(t, local)
}

func TestHostPort(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.1:8000": "10.0.0.1:8000",
		"vllm":          "vllm:80",
		"[::1]":         "[::1]:80",
		"[::1]:9000":    "[::1]:9000",
	} {
		if got := hostPort(in); got != want {
			t.Errorf("hostPort(%q) = %q, want %q", in, got, want)
		}
	}
}

// The lean path stands aside for a transport it does not follow.
func TestLeanOnlyForPlainTransports(t *testing.T) {
	withProxy := NewTransport()
	withProxy.Proxy = http.ProxyFromEnvironment
	capped := NewTransport()
	capped.MaxConnsPerHost = 10
	for name, tr := range map[string]*http.Transport{"proxy": withProxy, "capped": capped} {
		if NewLean(tr, false) != nil {
			t.Errorf("%s: lean path over a transport it does not follow", name)
		}
	}
	if NewLean(NewTransport(), false) == nil {
		t.Error("no lean path over the default transport")
	}
}

// A request without a body, or with one it can make again, goes again when
// its pooled connection turns out closed; the backend answers it once.
func TestLeanResendsOnIdleClosed(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		t.Run(method, func(t *testing.T) {
			be := newConnServer(t, streamEvents(1))
			lt := NewLean(NewTransport(), false)
			defer lt.CloseIdleConnections()
			roundTrip := func() {
				t.Helper()
				var body io.Reader
				if method == http.MethodPost {
					body = strings.NewReader(streamBody)
				}
				req, _ := http.NewRequest(method, be.URL+"/v1/chat/completions", body)
				res, err := lt.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, res.Body); err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
			}
			roundTrip()
			first := be.remoteAddrs()[0]
			be.CloseClientConnections()
			be.awaitClosed(t, first)
			roundTrip()
			if addrs := be.remoteAddrs(); len(addrs) != 2 || addrs[1] == first {
				t.Errorf("the backend saw requests from %v: want one on the first connection, one on a new one", addrs)
			}
		})
	}
}
