package proxy

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

	"github.com/kvroute/kvroute/internal/fleet"
)

// These tests push streams through the proxy: the lean path's push
// (internal/upstream) into the event copy (internal/sse).

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

// A stream pushed over the socket, split anywhere, reaches the client
// whole with its trailer, and its connection serves the next request; with
// raw system calls (the default) and through net.Conn.
func TestPushedStreamSplitAnywhere(t *testing.T) {
	for _, piece := range []int{1, 3, 7, 64, -7} {
		netConn := piece < 0
		piece = max(piece, -piece)
		t.Run(strconv.Itoa(piece)+map[bool]string{true: "/netconn"}[netConn], func(t *testing.T) {
			rb := newRawBackend(t, splitBody, piece, false)
			b0 := testBackend(t, 0, "b0", rb.url, "m")
			p, px := newTestProxy(t, newFakeFleet(b0), newFirstPolicy(), func(c *Config) { c.NetConnIO = netConn })
			for range 2 {
				res, body := post(t, px.URL, "/v1/chat/completions", streamBody)
				if res.StatusCode != 200 || body != evHi+evThere+evDone {
					t.Fatalf("status %d, body %q", res.StatusCode, body)
				}
				if got := res.Trailer.Get("X-Backend-Ttft"); got != "7" {
					t.Errorf("trailer X-Backend-Ttft %q, want 7 (trailers %v)", got, res.Trailer)
				}
			}
			waitFor(t, func() bool { return b0.Load() == (fleet.Load{}) })
			if n := rb.conns.Load(); n != 1 {
				t.Errorf("%d connections to the backend, want 1", n)
			}
			if n := leanOf(t, p).IdleConns(); n != 1 {
				t.Errorf("%d idle connections pooled, want 1", n)
			}
		})
	}
}

// A stream that breaks its framing or its connection mid-way ends with an
// error event and the end marker, and its connection is not reused.
func TestPushedStreamBreaksOff(t *testing.T) {
	tests := []struct {
		name, body string
	}{
		{name: "malformed size", body: chunk(evHi) + "zz\r\n" + chunk(evThere)},
		{name: "closed mid-chunk", body: chunk(evHi) + "40\r\ndata: {"},
		{name: "closed mid-size", body: chunk(evHi) + "4"},
		{name: "bad chunk end", body: chunk(evHi) + "2\r\nabXY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rb := newRawBackend(t, tt.body, 5, true)
			b0 := testBackend(t, 0, "b0", rb.url, "m")
			p, px := newTestProxy(t, newFakeFleet(b0), newFirstPolicy(), nil)
			req, _ := http.NewRequest(http.MethodPost, px.URL+"/v1/chat/completions", strings.NewReader(streamBody))
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			rd := bufio.NewReader(res.Body)
			if ev := event(t, rd); ev != evHi {
				t.Fatalf("first event %q", ev)
			}
			ev := event(t, rd)
			if _, _, code := openAIError(t, strings.TrimPrefix(ev, "data: ")); code != codeBackendError {
				t.Errorf("event %q, want an error with code %s", ev, codeBackendError)
			}
			if ev := event(t, rd); ev != evDone {
				t.Errorf("then %q, want the end marker", ev)
			}
			px.await(t)
			if n := leanOf(t, p).IdleConns(); n != 0 {
				t.Errorf("%d idle connections pooled, want 0", n)
			}
		})
	}
}
