package upstream

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// rawBackend answers every request on a connection with the bytes it was
// given, written a piece at a time so that the proxy's reads split them
// anywhere: a chunked stream as no net/http server would cut it.
type rawBackend struct {
	url   string
	conns atomic.Int32 // connections accepted
}

const rawHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nTrailer: X-Backend-Ttft\r\n\r\n"

// newRawBackend serves head and body in pieces of piece bytes; closeAfter
// closes the connection after one answer.
func newRawBackend(t *testing.T, body string, piece int, closeAfter bool) *rawBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rb := &rawBackend{url: "http://" + ln.Addr().String()}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			rb.conns.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				rb.serve(c, rawHead+body, piece, closeAfter)
			}()
		}
	}()
	return rb
}

func (rb *rawBackend) serve(c net.Conn, answer string, piece int, closeAfter bool) {
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		for off := 0; off < len(answer); off += piece {
			if _, err := io.WriteString(c, answer[off:min(off+piece, len(answer))]); err != nil {
				return
			}
			// Not for correctness: a pause makes the piece a read of its own.
			time.Sleep(100 * time.Microsecond)
		}
		if closeAfter {
			return
		}
	}
}

// chunk frames s as one chunk.
func chunk(s string) string { return strconv.FormatInt(int64(len(s)), 16) + "\r\n" + s + "\r\n" }

const (
	evHi    = `data: {"choices":[{"delta":{"content":"Hi"}}]}` + "\n\n"
	evThere = `data: {"choices":[{"delta":{"content":" there"}}]}` + "\n\n"
	evDone  = "data: [DONE]\n\n"
)

// The whole stream, every event split across chunks and reads, with an
// extension and a trailer.
var splitBody = "2a;x=y\r\n" + evHi[:42] + "\r\n" + chunk(evHi[42:]+evThere[:5]) + chunk(evThere[5:]) +
	chunk(evDone) + "0\r\nX-Backend-Ttft: 7\r\n\r\n"

// recordSink keeps what is pushed to it, through a small buffer (16 bytes
// unless size is set).
type recordSink struct {
	buf  [4096]byte
	size int // of the buffer it offers: 16 unless set
	got  []byte
	reqs int
	more bool // the last took's
}

func (s *recordSink) Space() ([]byte, error) {
	s.reqs++
	if s.size == 0 {
		return s.buf[:16], nil
	}
	return s.buf[:s.size], nil
}

func (s *recordSink) Took(n int, more bool) error {
	s.got = append(s.got, s.buf[:n]...)
	s.more = more
	return nil
}

// A lean chunked body pushes itself, bytes buffered with the headers first;
// one already read from does not.
func TestLeanBodyPush(t *testing.T) {
	rb := newRawBackend(t, splitBody, 1000, false)
	lt := NewLean(NewTransport(), false)
	defer lt.CloseIdleConnections()
	roundTrip := func() *http.Response {
		req, _ := http.NewRequest(http.MethodPost, rb.url+"/v1/chat/completions", strings.NewReader(streamBody))
		res, err := lt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := roundTrip()
	s := recordSink{size: 4096} // the whole body in one read
	ok, err := res.Body.(Pusher).Push(&s)
	if !ok || err != nil {
		t.Fatalf("push: ok %v, err %v", ok, err)
	}
	if string(s.got) != evHi+evThere+evDone || res.Trailer.Get("X-Backend-Ttft") != "7" {
		t.Fatalf("pushed %q, trailers %v", s.got, res.Trailer)
	}
	if !s.more {
		// The response's end follows at once: a flush of the last bytes
		// would be a write of their own.
		t.Error("the body's last bytes were pushed without more, as if a flush were due")
	}
	if n := lt.IdleConns(); n != 1 {
		t.Errorf("%d idle connections after a pushed body, want 1", n)
	}
	res = roundTrip()
	defer res.Body.Close()
	if _, err := res.Body.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if ok, _ := res.Body.(Pusher).Push(&s); ok {
		t.Error("a body already read from pushed itself")
	}
}
