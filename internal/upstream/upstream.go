// Package upstream carries the proxy's requests to the backends: the
// tuned net/http Transport (NewTransport), and in front of it a lean
// HTTP/1.1 path for plain-http backends (Lean) that makes no goroutine
// switch per request and pushes a streamed body off its socket to a Sink
// (push.go). It also builds the request to a backend from the client's
// (NewRequest), in the shape the lean path writes without allocating.
package upstream

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/rawsock"
)

// NewTransport returns the default transport to the backends: idle
// connections kept for many concurrent streams to few hosts, a short dial
// timeout (a refused or unroutable backend is retried elsewhere), no
// response-header timeout (a non-streaming generation sends its headers
// only when it is done), no proxy from the environment (backends are
// internal), no compression (the proxy reads usage from the bodies, and
// LLM traffic is small next to its compute), and idle connections dropped
// before the backends drop them (below).
func NewTransport() *http.Transport {
	return &http.Transport{
		DialContext: (&net.Dialer{
			Timeout:   3 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:   true,
		MaxIdleConns:        0, // no limit overall; per host below
		MaxIdleConnsPerHost: 1024,
		// Below the 5 s keep-alive of uvicorn (vLLM, SGLang) and
		// cpp-httplib (llama-server): a server that closes an idle
		// connection just as the proxy reuses it fails that request, and a
		// POST is not replayed.
		IdleConnTimeout:     4 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
		DisableCompression:  true,
		ReadBufferSize:      8 << 10,
		WriteBufferSize:     8 << 10,
	}
}

// Lean carries plain-http HTTP/1.1 requests to the backends in the
// goroutine that makes them: it writes the request, reads the response's
// headers and then its body on that goroutine, from a connection of its own
// small keep-alive pool. net/http's Transport hands every request to a
// connection's write loop and its response back from the read loop, two
// goroutine switches and a channel each way per request, and reads the body
// through three more layers; a proxy that does nothing else with the
// connection saves both. Everything it does not do (TLS, HTTP/2, proxies,
// connection caps, header timeouts) goes to the http.Transport it was made
// from, whose settings it keeps for the rest: dialer, idle timeout, idle
// connections per host, buffer sizes.
//
// A response body read to its end gives its connection back to the pool; one
// closed before (the client went away, a timeout, a retried status) closes
// it, and so does the request's context ending at any time, which also
// unblocks a read or write under way. Safe for concurrent use.
type Lean struct {
	std            *http.Transport
	dial           func(ctx context.Context, network, addr string) (net.Conn, error)
	idleFor        time.Duration
	maxIdle        int
	rbytes, wbytes int
	// raw reads and writes the connections with raw system calls
	// (internal/rawsock), pushed streams included.
	raw bool
	// Counts of connections: dialled, reused from the pool, resent (a
	// pooled one the backend had closed), closed before their response's
	// end.
	dialed, reused, resent, cut prometheus.Counter

	mu       sync.Mutex
	idle     map[string][]*leanConn // per host:port, oldest first
	sweeping bool                   // a sweep of expired idle connections is due
}

// leanConn is one pooled connection with its buffers.
type leanConn struct {
	nc  net.Conn
	br  *bufio.Reader
	bw  *bufio.Writer
	key string
	// reused is set once the connection has carried a response: a failure
	// before the next one's first byte may be the backend closing it while
	// idle.
	reused    bool
	idleSince time.Time
	// inq is whether the socket's reads tell what it still holds
	// (push_linux.go): inqUntried until a push first reads it.
	inq int8
	// close closes nc: made once, for every request's context.AfterFunc.
	close func()
	// pushFD is the callback that pushes the body of pushing, the
	// response being pushed, off the socket: made once (push_unix.go).
	pushFD  func(fd uintptr) bool
	pushing *leanBody
}

// NewLean returns the lean path in front of std, or nil when std is set up
// in a way it does not follow (a proxy, connection caps, a header timeout,
// compression, no keep-alives): then std carries everything. raw reads and
// writes its connections with raw system calls (internal/rawsock), not
// through net.Conn.
func NewLean(std *http.Transport, raw bool) *Lean {
	if std.Proxy != nil || std.MaxConnsPerHost > 0 || std.ResponseHeaderTimeout > 0 || !std.DisableCompression ||
		std.DisableKeepAlives || std.DialTLSContext != nil || std.Dial != nil {
		return nil
	}
	t := &Lean{
		std:     std,
		dial:    std.DialContext,
		idleFor: std.IdleConnTimeout,
		maxIdle: std.MaxIdleConnsPerHost,
		rbytes:  std.ReadBufferSize,
		wbytes:  std.WriteBufferSize,
		raw:     raw,
		idle:    map[string][]*leanConn{},
	}
	if t.dial == nil {
		t.dial = (&net.Dialer{}).DialContext
	}
	t.CountOn(NewConnCounter()) // unregistered until the caller's metrics are
	if t.maxIdle <= 0 {
		t.maxIdle = http.DefaultMaxIdleConnsPerHost
	}
	if t.rbytes <= 0 {
		t.rbytes = 4 << 10
	}
	if t.wbytes <= 0 {
		t.wbytes = 4 << 10
	}
	return t
}

// NewConnCounter returns kvroute_upstream_connections_total, for the
// caller to register and pass to CountOn.
func NewConnCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_upstream_connections_total",
		Help: `Connections of the lean path to the backends (--stdlib-upstream off), by event: "dialed", "reused" (from the keep-alive pool), "resent" (a pooled connection the backend had closed; the request went again on a new one), "closed_early" (closed before the response's end: the client went away, a timeout, a retried status).`},
		[]string{"event"})
}

// CountOn counts the connections' events on v, a NewConnCounter. Call it
// before the first request.
func (t *Lean) CountOn(v *prometheus.CounterVec) {
	t.dialed, t.reused = v.WithLabelValues("dialed"), v.WithLabelValues("reused")
	t.resent, t.cut = v.WithLabelValues("resent"), v.WithLabelValues("closed_early")
}

// RoundTrip sends req and returns the response, whose body must be read to
// its end or closed.
func (t *Lean) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || req.Method == http.MethodConnect || req.URL.Host == "" {
		return t.std.RoundTrip(req)
	}
	key := hostPort(req.URL.Host)
	for {
		c, err := t.conn(req.Context(), key)
		if err != nil {
			return nil, err
		}
		res, err := t.exchange(c, req)
		if err == nil {
			return res, nil
		}
		// A kept-alive connection the backend closed while it sat idle fails
		// before its answer's first byte; the request goes again on another,
		// as net/http's Transport resends it.
		if !c.reused || !errors.Is(err, errIdleClosed) || req.Context().Err() != nil {
			return nil, err
		}
		switch {
		case req.GetBody != nil:
			if req.Body, err = req.GetBody(); err != nil {
				return nil, err
			}
		case req.Body != nil && req.Body != http.NoBody:
			return nil, err // sent, and it cannot be again
		}
		t.resent.Inc()
	}
}

// errIdleClosed marks a connection that failed before anything of the
// response came back.
var errIdleClosed = errors.New("the backend closed the connection before answering")

// exchange writes req on c and reads the response's headers. The response's
// body owns c from then on; on an error c is closed.
func (t *Lean) exchange(c *leanConn, req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	stop := context.AfterFunc(ctx, c.close)
	fail := func(err error) (*http.Response, error) {
		stop()
		c.nc.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	err := writeRequest(c.bw, req)
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		if isConnClosed(err) {
			err = errors.Join(errIdleClosed, err)
		}
		return fail(err)
	}
	if _, err := c.br.Peek(1); err != nil {
		if isConnClosed(err) {
			err = errors.Join(errIdleClosed, err)
		}
		return fail(err)
	}
	res, err := http.ReadResponse(c.br, req)
	for err == nil && res.StatusCode < 200 && res.StatusCode != http.StatusSwitchingProtocols {
		res, err = http.ReadResponse(c.br, req) // 1xx: the answer follows
	}
	if err != nil {
		return fail(err)
	}
	chunked := res.Body != http.NoBody && len(res.TransferEncoding) == 1 && res.TransferEncoding[0] == "chunked"
	res.Body = &leanBody{t: t, c: c, res: res, body: res.Body, stop: stop, keep: !res.Close && !req.Close, chunked: chunked}
	return res, nil
}

// isConnClosed reports whether err is a connection the peer closed or reset.
func isConnClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// leanBody is a response's body on a lean connection.
type leanBody struct {
	t    *Lean
	c    *leanConn // nil once released
	res  *http.Response
	body io.Reader
	stop func() bool
	keep bool // the response allows another request on the connection
	eof  bool
	// chunked is set for a chunked body, which push can take; read once
	// the body has been read from.
	chunked, read bool
	// push's decoder, and its socket callback's state (push_unix.go).
	dec     chunkDecoder
	pushDec *chunkDecoder
	sink    Sink
	pushErr error
}

var errBodyClosed = errors.New("read of a closed response body")

func (b *leanBody) Read(p []byte) (int, error) {
	if b.c == nil {
		if b.eof {
			return 0, io.EOF
		}
		return 0, errBodyClosed
	}
	b.read = true
	n, err := b.body.Read(p)
	if err != nil {
		b.eof = err == io.EOF
		b.release(b.eof)
	}
	return n, err
}

// Close closes the connection unless the body was read to its end.
func (b *leanBody) Close() error {
	b.release(false)
	return nil
}

// release gives the connection back to the pool if the response is complete
// and allows it, and closes it otherwise.
func (b *leanBody) release(complete bool) {
	c := b.c
	if c == nil {
		return
	}
	b.c = nil
	// stop is false once the context ended: the connection is being closed.
	if b.stop() && complete && b.keep && c.br.Buffered() == 0 {
		b.t.put(c)
		return
	}
	if !complete {
		b.t.cut.Inc()
	}
	c.discard()
}

// conn returns an idle connection to key, or dials one.
func (t *Lean) conn(ctx context.Context, key string) (*leanConn, error) {
	if c := t.get(key); c != nil {
		t.reused.Inc()
		return c, nil
	}
	t.dialed.Inc()
	nc, err := t.dial(ctx, "tcp", key)
	if err != nil {
		return nil, err
	}
	if t.raw {
		nc = rawsock.Wrap(nc)
	}
	c := &leanConn{nc: nc, br: newLeanReader(nc, t.rbytes), bw: newLeanWriter(nc, t.wbytes), key: key,
		close: func() { nc.Close() }}
	c.initPush()
	return c, nil
}

// The buffers of connections closed, for the next ones dialled: clients
// that come back after a lull find the idle connections expired, and each
// new one would otherwise allocate its two buffers (16 KB with
// NewTransport) in a burst that brings the next garbage collection closer.
var leanReaders, leanWriters sync.Pool

func newLeanReader(nc net.Conn, size int) *bufio.Reader {
	if br, ok := leanReaders.Get().(*bufio.Reader); ok && br.Size() == size {
		br.Reset(nc)
		return br
	}
	return bufio.NewReaderSize(nc, size)
}

func newLeanWriter(nc net.Conn, size int) *bufio.Writer {
	if bw, ok := leanWriters.Get().(*bufio.Writer); ok && bw.Size() == size {
		bw.Reset(nc)
		return bw
	}
	return bufio.NewWriterSize(nc, size)
}

// discard closes c, which no one else reads or writes (idle in the pool, or
// its response done with), and gives its buffers to the next connection.
func (c *leanConn) discard() {
	c.nc.Close()
	c.br.Reset(nil)
	c.bw.Reset(nil)
	leanReaders.Put(c.br)
	leanWriters.Put(c.bw)
	c.br, c.bw = nil, nil
}

// get takes the most recently used idle connection to key that has not
// expired: the one least likely to have been closed by the backend.
func (t *Lean) get(key string) *leanConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	conns := t.idle[key]
	if len(conns) == 0 {
		return nil
	}
	c := conns[len(conns)-1]
	conns[len(conns)-1] = nil
	t.idle[key] = conns[:len(conns)-1]
	if t.idleFor > 0 && time.Since(c.idleSince) >= t.idleFor {
		// The rest are older still: the sweep closes them.
		c.discard()
		return nil
	}
	return c
}

// put pools c, unless key has its fill of idle connections.
func (t *Lean) put(c *leanConn) {
	c.reused = true
	c.idleSince = time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.idle[c.key]) >= t.maxIdle {
		c.discard()
		return
	}
	t.idle[c.key] = append(t.idle[c.key], c)
	if t.idleFor > 0 && !t.sweeping {
		t.sweeping = true
		time.AfterFunc(t.idleFor, t.sweep)
	}
}

// sweep closes the idle connections past the idle timeout and, while some
// are left, runs again when the oldest of them expires.
func (t *Lean) sweep() {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	next := time.Duration(-1)
	for key, conns := range t.idle {
		n := 0
		for n < len(conns) && now.Sub(conns[n].idleSince) >= t.idleFor {
			conns[n].discard()
			n++
		}
		if n == len(conns) {
			delete(t.idle, key)
			continue
		}
		t.idle[key] = append(conns[:0], conns[n:]...)
		clear(conns[len(conns)-n:])
		if left := t.idleFor - now.Sub(t.idle[key][0].idleSince); next < 0 || left < next {
			next = left
		}
	}
	if next < 0 {
		t.sweeping = false
		return
	}
	time.AfterFunc(next, t.sweep)
}

// IdleConns returns how many connections the pool holds idle now.
func (t *Lean) IdleConns() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, cs := range t.idle {
		n += len(cs)
	}
	return n
}

// CloseIdleConnections closes the idle connections of both paths.
func (t *Lean) CloseIdleConnections() {
	t.mu.Lock()
	for key, conns := range t.idle {
		for _, c := range conns {
			c.discard()
		}
		delete(t.idle, key)
	}
	t.mu.Unlock()
	t.std.CloseIdleConnections()
}

// hostPort is host with the http port when it names none.
func hostPort(host string) string {
	if _, _, err := net.SplitHostPort(host); err == nil {
		return host
	}
	return net.JoinHostPort(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), "80")
}
