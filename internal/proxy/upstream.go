package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/rawsock"
)

// leanTransport carries plain-http HTTP/1.1 requests to the backends in the
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
type leanTransport struct {
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

// newLeanTransport returns the lean path in front of std, or nil when std is
// set up in a way it does not follow (a proxy, connection caps, a header
// timeout, compression, no keep-alives): then std carries everything.
func newLeanTransport(std *http.Transport) *leanTransport {
	if std.Proxy != nil || std.MaxConnsPerHost > 0 || std.ResponseHeaderTimeout > 0 || !std.DisableCompression ||
		std.DisableKeepAlives || std.DialTLSContext != nil || std.Dial != nil {
		return nil
	}
	t := &leanTransport{
		std:     std,
		dial:    std.DialContext,
		idleFor: std.IdleConnTimeout,
		maxIdle: std.MaxIdleConnsPerHost,
		rbytes:  std.ReadBufferSize,
		wbytes:  std.WriteBufferSize,
		idle:    map[string][]*leanConn{},
	}
	if t.dial == nil {
		t.dial = (&net.Dialer{}).DialContext
	}
	t.countOn(newUpstreamCounter()) // unregistered until the proxy's metrics are
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

// newUpstreamCounter is kvroute_upstream_connections_total.
func newUpstreamCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_upstream_connections_total",
		Help: `Connections of the lean path to the backends (--stdlib-upstream off), by event: "dialed", "reused" (from the keep-alive pool), "resent" (a pooled connection the backend had closed; the request went again on a new one), "closed_early" (closed before the response's end: the client went away, a timeout, a retried status).`},
		[]string{"event"})
}

// countOn counts the connections' events on v.
func (t *leanTransport) countOn(v *prometheus.CounterVec) {
	t.dialed, t.reused = v.WithLabelValues("dialed"), v.WithLabelValues("reused")
	t.resent, t.cut = v.WithLabelValues("resent"), v.WithLabelValues("closed_early")
}

// RoundTrip sends req and returns the response, whose body must be read to
// its end or closed.
func (t *leanTransport) RoundTrip(req *http.Request) (*http.Response, error) {
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
func (t *leanTransport) exchange(c *leanConn, req *http.Request) (*http.Response, error) {
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
	t    *leanTransport
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
	sink    byteSink
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
func (t *leanTransport) conn(ctx context.Context, key string) (*leanConn, error) {
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
func (t *leanTransport) get(key string) *leanConn {
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
func (t *leanTransport) put(c *leanConn) {
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
func (t *leanTransport) sweep() {
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

// CloseIdleConnections closes the idle connections of both paths.
func (t *leanTransport) CloseIdleConnections() {
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

// writeRequest writes req to w as req.Write does, byte for byte, for the
// requests the proxy makes (upstreamRequest: a body in memory, no trailers,
// no tracing hooks, a plain host); others it hands to req.Write. req.Write
// formats the request line and the Host and User-Agent lines with fmt,
// and sends the body through a transfer writer and a LimitReader: six
// allocations a request, where this makes none.
func writeRequest(w *bufio.Writer, req *http.Request) error {
	body, ok := req.Body.(*upstreamBody)
	if !ok || int64(body.Len()) != req.ContentLength || req.ContentLength <= 0 || req.Close ||
		len(req.TransferEncoding) > 0 || req.Trailer != nil || req.Host != "" || req.URL.Opaque != "" ||
		req.Method == "" || req.Method == http.MethodConnect || !plainHost(req.URL.Host) ||
		httptrace.ContextClientTrace(req.Context()) != nil || !plainValues(req.Header) {
		return req.Write(w)
	}
	ruri := req.URL.RequestURI()
	if strings.ContainsFunc(ruri, isCTL) {
		return req.Write(w) // which refuses it
	}
	defer req.Body.Close()
	w.WriteString(req.Method)
	w.WriteByte(' ')
	w.WriteString(ruri)
	w.WriteString(" HTTP/1.1\r\nHost: ")
	w.WriteString(req.URL.Host)
	w.WriteString("\r\n")
	ua := "Go-http-client/1.1" // net/http's default, unless the header says otherwise
	if vv, ok := req.Header["User-Agent"]; ok {
		ua = ""
		if len(vv) > 0 {
			ua = textproto.TrimString(vv[0])
		}
	}
	if ua != "" {
		w.WriteString("User-Agent: ")
		w.WriteString(ua)
		w.WriteString("\r\n")
	}
	w.WriteString("Content-Length: ")
	w.Write(strconv.AppendInt(w.AvailableBuffer(), req.ContentLength, 10))
	w.WriteString("\r\n")
	// In the order of the keys, as net/http writes them.
	var room [32]string
	keys := room[:0]
	for k := range req.Header {
		switch k {
		case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		if validFieldName(k) { // net/http leaves invalid ones out
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range req.Header[k] {
			w.WriteString(k)
			w.WriteString(": ")
			w.WriteString(textproto.TrimString(v))
			w.WriteString("\r\n")
		}
	}
	w.WriteString("\r\n")
	_, err := body.WriteTo(w)
	return err
}

// plainHost reports whether host is written as it is by req.Write: ASCII
// letters, digits, dots, dashes, colons and an IPv6 address's brackets, no
// zone.
func plainHost(host string) bool {
	for i := range len(host) {
		switch c := host[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '.', c == '-', c == ':', c == '[', c == ']':
		default:
			return false
		}
	}
	return host != ""
}

// plainValues reports whether no header value has a line break, which
// req.Write would replace.
func plainValues(h http.Header) bool {
	for _, vv := range h {
		for _, v := range vv {
			if strings.ContainsAny(v, "\r\n") {
				return false
			}
		}
	}
	return true
}

func isCTL(r rune) bool { return r < ' ' || r == 0x7f }

// validFieldName reports whether k is an HTTP token (RFC 9110 5.1).
func validFieldName(k string) bool {
	if k == "" {
		return false
	}
	for i := range len(k) {
		c := k[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}
