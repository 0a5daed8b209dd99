package balancer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
)

// balancerWants says what each kind must do; every kind Kinds lists
// needs an entry.
var balancerWants = map[string]struct {
	sticky    bool // same X-Session-ID, same backend
	leastConn bool // avoids a backend with a request in flight
}{
	"nginx-round-robin":  {},
	"nginx-least-conn":   {leastConn: true},
	"nginx-hash":         {sticky: true},
	"haproxy-roundrobin": {},
	"haproxy-leastconn":  {leastConn: true},
	"haproxy-hdr":        {sticky: true},
}

// requireBalancer skips the test when kind's program is not installed, and
// fails it under CI, whose .ci/run must install it.
func requireBalancer(t *testing.T, kind string) {
	t.Helper()
	ok, why := Available(kind)
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s: %s; .ci/run should install it (apt-get install -y --no-install-recommends nginx haproxy)", kind, why)
	}
	t.Skipf("%s: %s", kind, why)
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// streamEvents and streamGap shape the SSE endpoint of a testBackend.
const (
	streamEvents = 5
	streamGap    = 20 * time.Millisecond
)

// streamProbe is an SSE endpoint that sends streamEvents events
// streamGap apart, flushing each, and records when it sent them, by the
// request's id query parameter.
type streamProbe struct {
	mu   sync.Mutex
	sent map[string][]time.Time
}

func (p *streamProbe) serve(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	for i := range streamEvents {
		if i > 0 {
			time.Sleep(streamGap) // the fake backend's pace, not a wait for state
		}
		p.mu.Lock()
		p.sent[id] = append(p.sent[id], time.Now())
		p.mu.Unlock()
		fmt.Fprintf(w, "data: %d\n\n", i)
		if err := rc.Flush(); err != nil {
			return
		}
	}
}

func (p *streamProbe) sentTimes(id string) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.sent[id])
}

// testBackend is a loopback server that names itself, echoes the
// X-Session-ID it got, streams SSE, holds requests on demand and serves the
// OpenAI API through an emulator.
type testBackend struct {
	name string
	url  string
	// held receives once a /hold request has arrived; it is answered when
	// release is closed.
	held    chan struct{}
	release chan struct{}
}

func startTestBackend(t *testing.T, name string, probe *streamProbe) *testBackend {
	t.Helper()
	em, err := emulator.New(emulator.Config{TimeScale: 0.001, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		em.Run(ctx)
	}()
	b := &testBackend{name: name, held: make(chan struct{}, 16), release: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/name", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Got-Session", r.Header.Get("X-Session-ID"))
		io.WriteString(w, name)
	})
	mux.HandleFunc("/size", func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, n)
	})
	mux.HandleFunc("/hold", func(w http.ResponseWriter, r *http.Request) {
		b.held <- struct{}{}
		select {
		case <-b.release:
		case <-r.Context().Done():
		}
		io.WriteString(w, name)
	})
	mux.HandleFunc("/stream", probe.serve)
	mux.Handle("/", em)
	srv := httptest.NewServer(mux)
	b.url = srv.URL
	t.Cleanup(func() {
		cancel()
		<-ran
		srv.Close()
	})
	return b
}

// get sends GET path with X-Session-ID session and returns the backend that
// answered and the session id it saw.
func get(t *testing.T, c *http.Client, base, path, session string) (backend, gotSession string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Session-ID", session)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d: %s", path, resp.StatusCode, body)
	}
	return string(body), resp.Header.Get("X-Got-Session")
}

// Each real balancer, started in front of two loopback backends, balances
// as its kind says, passes X-Session-ID through, streams event by event,
// carries an emulator's chat completion and stops cleanly.
func TestBalancer(t *testing.T) {
	for _, kind := range Kinds() {
		t.Run(kind, func(t *testing.T) {
			want, ok := balancerWants[kind]
			if !ok {
				t.Fatalf("balancerWants has no entry for %s", kind)
			}
			requireBalancer(t, kind)
			probe := &streamProbe{sent: map[string][]time.Time{}}
			backends := []*testBackend{startTestBackend(t, "a", probe), startTestBackend(t, "b", probe)}
			bal, err := Start(t.Context(), kind, []string{backends[0].url, backends[1].url}, testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { bal.Close() })
			if bal.Kind != kind || !strings.HasPrefix(bal.URL, "http://127.0.0.1:") {
				t.Fatalf("Balancer{Kind: %q, URL: %q}", bal.Kind, bal.URL)
			}
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.Proxy = nil
			client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			t.Cleanup(client.CloseIdleConnections)

			t.Run("session header", func(t *testing.T) {
				for i := range 4 {
					id := fmt.Sprintf("Sess-%d_aB.c=1", i)
					if _, got := get(t, client, bal.URL, "/name", id); got != id {
						t.Errorf("backend got X-Session-ID %q, want %q", got, id)
					}
				}
			})

			if want.sticky {
				t.Run("sticky", func(t *testing.T) { testSticky(t, client, bal.URL) })
			} else {
				t.Run("spread", func(t *testing.T) { testSpread(t, client, bal.URL) })
			}
			if want.leastConn {
				t.Run("least conn", func(t *testing.T) { testLeastConn(t, client, bal.URL, backends) })
			}
			t.Run("large body", func(t *testing.T) { testLargeBody(t, client, bal.URL) })
			t.Run("stream", func(t *testing.T) { testStream(t, client, bal.URL, probe) })
			t.Run("chat completion", func(t *testing.T) { testChat(t, client, bal.URL) })

			t.Run("close", func(t *testing.T) {
				client.CloseIdleConnections()
				if err := bal.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				if err := bal.Close(); err != nil {
					t.Errorf("second Close: %v", err)
				}
				addr := strings.TrimPrefix(bal.URL, "http://")
				if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
					conn.Close()
					t.Errorf("%s still accepts connections after Close", addr)
				}
				if _, err := os.Stat(bal.dir); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("temp dir %s not removed: %v", bal.dir, err)
				}
			})
		})
	}
}

// testSpread: sequential requests reach both backends about evenly.
func testSpread(t *testing.T, c *http.Client, base string) {
	const n = 20
	hits := map[string]int{}
	for i := range n {
		b, _ := get(t, c, base, "/name", fmt.Sprintf("spread-%d", i))
		hits[b]++
	}
	if hits["a"] < n/4 || hits["b"] < n/4 {
		t.Errorf("%d requests split %v, want both backends used", n, hits)
	}
}

// testSticky: each session id always reaches one backend, and the ids
// together reach both.
func testSticky(t *testing.T, c *http.Client, base string) {
	const ids, repeats = 32, 3
	hits := map[string]int{}
	for i := range ids {
		id := fmt.Sprintf("session-%d", i)
		first, _ := get(t, c, base, "/name", id)
		hits[first]++
		for range repeats - 1 {
			if b, _ := get(t, c, base, "/name", id); b != first {
				t.Fatalf("session %s went to %s, then to %s", id, first, b)
			}
		}
	}
	if hits["a"] == 0 || hits["b"] == 0 {
		t.Errorf("%d session ids split %v, want both backends used", ids, hits)
	}
}

// testLeastConn: while one backend holds a request, new ones go to the other.
func testLeastConn(t *testing.T, c *http.Client, base string, backends []*testBackend) {
	done := make(chan string, 1)
	go func() {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/hold", nil)
		resp, err := c.Do(req)
		if err != nil {
			done <- "error: " + err.Error()
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		done <- string(body)
	}()
	var busy, idle string
	select {
	case <-backends[0].held:
		busy, idle = "a", "b"
	case <-backends[1].held:
		busy, idle = "b", "a"
	case <-time.After(5 * time.Second):
		t.Fatal("the held request reached no backend")
	}
	for i := range 6 {
		if b, _ := get(t, c, base, "/name", fmt.Sprintf("lc-%d", i)); b != idle {
			t.Errorf("request %d went to %s, which holds a request; want %s", i, b, idle)
		}
	}
	for _, b := range backends {
		close(b.release)
	}
	if got := <-done; got != busy {
		t.Errorf("held request answered %q, want %q", got, busy)
	}
}

// testLargeBody: a long prompt's body (above nginx's default 1 MiB limit
// and its in-memory body buffer) reaches the backend whole.
func testLargeBody(t *testing.T, c *http.Client, base string) {
	const size = 8 << 20
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/size", bytes.NewReader(make([]byte, size)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != fmt.Sprint(size) {
		t.Errorf("status %d, backend read %q bytes; want 200 and %d", resp.StatusCode, body, size)
	}
}

// testStream: SSE events arrive one by one: the first before the backend
// sends the fourth (60 ms later), which a balancer that buffers, or holds
// small writes for 200 ms as HAProxy does without http-no-delay, cannot
// meet. A loaded machine may stall one attempt that long, three in a row
// it will not: the test passes on the first good attempt.
func testStream(t *testing.T, c *http.Client, base string, probe *streamProbe) {
	const attempts = 3
	var report []string
	for attempt := range attempts {
		id := fmt.Sprint(attempt)
		recv := streamOnce(t, c, base+"/stream?id="+id)
		sent := probe.sentTimes(id)
		if len(sent) != streamEvents {
			t.Fatalf("backend sent %d events, want %d", len(sent), streamEvents)
		}
		if recv[0].Before(sent[3]) {
			return
		}
		report = append(report, fmt.Sprintf("attempt %d:", attempt))
		for i := range sent {
			report = append(report, fmt.Sprintf("  #%d sent +%v received +%v", i, sent[i].Sub(sent[0]), recv[i].Sub(sent[0])))
		}
	}
	t.Errorf("first event received only after the fourth was sent, %d times: buffered?\n%s", attempts, strings.Join(report, "\n"))
}

// streamOnce reads one SSE response from url and returns when each event
// arrived.
func streamOnce(t *testing.T, c *http.Client, url string) []time.Time {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Session-ID", "stream")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q, want text/event-stream", ct)
	}
	var (
		recv []time.Time
		data []string
	)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			recv = append(recv, time.Now())
			data = append(data, d)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"0", "1", "2", "3", "4"}; !slices.Equal(data, want) {
		t.Fatalf("events %q, want %q", data, want)
	}
	return recv
}

// testChat: a streamed chat completion from an emulator arrives whole.
func testChat(t *testing.T, c *http.Client, base string) {
	body, _ := json.Marshal(map[string]any{
		"messages":   []map[string]string{{"role": "user", "content": "Say hello through the balancer."}},
		"max_tokens": 8,
		"stream":     true,
	})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-ID", "chat")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, msg)
	}
	chunks, done := 0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if d == "[DONE]" {
			done = true
			break
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(d), &chunk); err != nil {
			t.Fatalf("bad event %q: %v", d, err)
		}
		for _, ch := range chunk.Choices {
			if ch.Delta.Content != "" {
				chunks++
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !done || chunks == 0 {
		t.Errorf("stream ended with [DONE] %v after %d content chunks", done, chunks)
	}
}

// The generated configs carry the settings the comparison depends on.
func TestBalancerConfig(t *testing.T) {
	common := map[string][]string{
		"nginx": {
			"daemon off;", "master_process on;", "worker_processes 1;", "worker_connections 16384;",
			"access_log off;", "gzip off;", "client_max_body_size 64m;",
			"proxy_buffering off;", "proxy_request_buffering on;", "client_body_buffer_size 1m;", "proxy_http_version 1.1;",
			`proxy_set_header Connection "";`, "keepalive 256;",
			"proxy_read_timeout 60s;", "proxy_send_timeout 60s;", "proxy_cache off;",
			"proxy_next_upstream error timeout http_502 http_503 http_504 http_429 non_idempotent;",
			"proxy_next_upstream_tries 3;", "proxy_connect_timeout 3s;",
			"client_body_temp_path \"/tmp/kv/client_body\";", "proxy_temp_path \"/tmp/kv/proxy\";",
			"pid \"/tmp/kv/nginx.pid\";", "error_log stderr",
			"server 127.0.0.1:8001 max_fails=3 fail_timeout=10s;", "server 127.0.0.1:8002 max_fails=3 fail_timeout=10s;",
			"listen 127.0.0.1:9000;", "location = /ready",
		},
		"haproxy": {
			"mode http", "option http-keep-alive", "timeout connect 3s", "timeout client 3600s", "timeout server 60s",
			"maxconn 8192", "bind 127.0.0.1:9000", "monitor-uri /ready",
			"option http-buffer-request", "retries 3", "option redispatch 1", "retry-on all-retryable-errors",
			"tune.bufsize 1048576", "option httpchk GET /health",
			"server b0 127.0.0.1:8001 check inter 2s fall 3 rise 2 observe layer7 error-limit 3 on-error mark-down",
			"server b1 127.0.0.1:8002 check",
		},
	}
	// Retries need the request buffered, but responses must stream.
	forbidden := []string{"compression", "proxy_cache_path", "gzip on", "cache-use", "proxy_buffering on"}
	tests := []struct {
		kind    string
		want    []string
		wantNot []string
	}{
		{kind: "nginx-round-robin", wantNot: []string{"least_conn", "hash "}},
		{kind: "nginx-least-conn", want: []string{"least_conn;"}},
		{kind: "nginx-hash", want: []string{"hash $http_x_session_id consistent;"}},
		{kind: "haproxy-roundrobin", want: []string{"balance roundrobin"}, wantNot: []string{"hash-type"}},
		{kind: "haproxy-leastconn", want: []string{"balance leastconn"}, wantNot: []string{"hash-type"}},
		{kind: "haproxy-hdr", want: []string{"balance hdr(X-Session-ID)", "hash-type consistent"}},
	}
	if len(tests) != len(Kinds()) {
		t.Fatalf("%d cases for %d kinds", len(tests), len(Kinds()))
	}
	for _, tt := range tests {
		t.Run(tt.kind, func(t *testing.T) {
			k, ok := findKind(tt.kind)
			if !ok {
				t.Fatalf("kind %s not found", tt.kind)
			}
			_, conf, err := k.render(balancerConfig{
				Kind: k.name, Dir: "/tmp/kv", Listen: "127.0.0.1:9000", Ready: "/ready",
				Method: k.method, Servers: []string{"127.0.0.1:8001", "127.0.0.1:8002"},
			})
			if err != nil {
				t.Fatal(err)
			}
			text := string(conf)
			for _, s := range append(common[k.program], tt.want...) {
				if !strings.Contains(text, s) {
					t.Errorf("config lacks %q:\n%s", s, text)
				}
			}
			for _, s := range append(forbidden, tt.wantNot...) {
				if strings.Contains(text, s) {
					t.Errorf("config has %q:\n%s", s, text)
				}
			}
			if k.program == "nginx" {
				if m := strings.Join(k.method, ""); m != "" && strings.Index(text, m) > strings.Index(text, "keepalive 256;") {
					t.Errorf("balancing method %q after keepalive, which nginx rejects", m)
				}
			}
		})
	}
}

// Start rejects bad input before starting anything.
func TestStartBalancerErrors(t *testing.T) {
	tests := []struct {
		name     string
		kind     string
		backends []string
		wantErr  error
	}{
		{name: "unknown kind", kind: "nginx-random", backends: []string{"http://127.0.0.1:1"}, wantErr: ErrUnknownKind},
		{name: "no backends", kind: "nginx-round-robin"},
		{name: "https", kind: "nginx-round-robin", backends: []string{"https://127.0.0.1:1"}},
		{name: "no scheme", kind: "haproxy-roundrobin", backends: []string{"127.0.0.1:1"}},
		{name: "path", kind: "haproxy-roundrobin", backends: []string{"http://127.0.0.1:1/v1"}},
		{name: "bad port", kind: "haproxy-roundrobin", backends: []string{"http://127.0.0.1:0"}},
		{name: "injection", kind: "nginx-round-robin", backends: []string{"http://a;b:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Start(t.Context(), tt.kind, tt.backends, nil)
			if err == nil {
				b.Close()
				t.Fatal("Start succeeded")
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error %v, want %v", err, tt.wantErr)
			}
		})
	}
	if _, err := lookProgram("kvroute-no-such-balancer"); !errors.Is(err, ErrNotInstalled) {
		t.Errorf("lookProgram of a missing program: %v, want ErrNotInstalled", err)
	}
	if ok, why := Available("nginx-random"); ok || !strings.Contains(why, "unknown") {
		t.Errorf("Available(nginx-random) = %v, %q", ok, why)
	}
}

// childLog logs lines at the level they name and keeps the last ones.
func TestBalancerChildLog(t *testing.T) {
	var buf bytes.Buffer
	c := &childLog{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	io.WriteString(c, "2026/01/01 [emerg] 1#1: bind() to 127.0.0.1:1 failed (98: Address already in use)\n[WARNING]  (7) : some")
	io.WriteString(c, "thing\npartial")
	out := buf.String()
	if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "level=WARN") || !strings.Contains(out, "something") {
		t.Errorf("log:\n%s", out)
	}
	if got := c.tailText(); !strings.HasSuffix(got, "something\npartial") {
		t.Errorf("tail %q", got)
	}
	for i := range 2 * balancerTailLines {
		fmt.Fprintf(c, "line %d\n", i)
	}
	if got := strings.Count(c.tailText(), "\n") + 1; got != balancerTailLines {
		t.Errorf("tail has %d lines, want %d", got, balancerTailLines)
	}
}

// A port taken between picking and binding costs one retry on another port;
// a stop through ctx is a clean stop; a child that dies on its own makes
// Close report it.
func TestBalancerLifecycle(t *testing.T) {
	for _, kind := range []string{"nginx-round-robin", "haproxy-roundrobin"} {
		t.Run(kind, func(t *testing.T) {
			requireBalancer(t, kind)
			backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
			t.Cleanup(backend.Close)

			t.Run("port taken", func(t *testing.T) {
				taken, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				defer taken.Close()
				takenPort := fmt.Sprint(taken.Addr().(*net.TCPAddr).Port)
				calls := 0
				balancerPort = func() (string, error) {
					calls++
					if calls == 1 {
						return takenPort, nil
					}
					return freePort()
				}
				defer func() { balancerPort = freePort }()
				bal, err := Start(t.Context(), kind, []string{backend.URL}, testLogger(t))
				if err != nil {
					t.Fatal(err)
				}
				defer bal.Close()
				if calls != 2 || strings.HasSuffix(bal.URL, ":"+takenPort) {
					t.Errorf("%d port picks, URL %s; want a retry off port %s", calls, bal.URL, takenPort)
				}
			})

			t.Run("context", func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				bal, err := Start(ctx, kind, []string{backend.URL}, testLogger(t))
				if err != nil {
					cancel()
					t.Fatal(err)
				}
				cancel()
				<-bal.done
				if err := bal.Close(); err != nil {
					t.Errorf("Close after ctx done: %v", err)
				}
			})

			t.Run("died", func(t *testing.T) {
				bal, err := Start(t.Context(), kind, []string{backend.URL}, testLogger(t))
				if err != nil {
					t.Fatal(err)
				}
				// SIGTERM: a SIGKILLed nginx master would orphan its worker.
				if err := bal.cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				<-bal.done
				if err := bal.Close(); err == nil || !strings.Contains(err.Error(), "exited before Close") {
					t.Errorf("Close after the child died: %v, want an error", err)
				}
				if _, err := os.Stat(bal.dir); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("temp dir %s not removed: %v", bal.dir, err)
				}
			})
		})
	}
}

// benchSink keeps the compiler from discarding benchmark results.
var benchSink int64

// One small request's round trip through each balancer, against the backend
// directly: the latency a balancer adds.
func BenchmarkBalancerRoundTrip(b *testing.B) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	defer backend.Close()
	run := func(b *testing.B, url string) {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.Proxy = nil
		c := &http.Client{Transport: tr}
		defer c.CloseIdleConnections()
		b.ReportAllocs()
		for b.Loop() {
			resp, err := c.Get(url + "/")
			if err != nil {
				b.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			benchSink += n
		}
	}
	b.Run("direct", func(b *testing.B) { run(b, backend.URL) })
	for _, kind := range Kinds() {
		b.Run(kind, func(b *testing.B) {
			if ok, why := Available(kind); !ok {
				b.Skip(why)
			}
			bal, err := Start(context.Background(), kind, []string{backend.URL}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer bal.Close()
			run(b, bal.URL)
		})
	}
}
