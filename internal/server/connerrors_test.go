package server

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// TestMalformedRequestsGetOpenAIErrors sends what net/http refuses before
// any handler runs, over a raw connection: every answer has the status
// net/http chose and an OpenAI-shaped JSON body. A well-formed request on
// the same listener is answered by the proxy as usual.
func TestMalformedRequestsGetOpenAIErrors(t *testing.T) {
	b, err := fleet.ParseBackend(0, "gpu0=http://127.0.0.1:1") // nothing listens: no backend in rotation
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(context.Background(), Config{Backends: []*fleet.Backend{b}, Policy: "kvroute", Listen: "127.0.0.1:0",
		DrainDelay: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	addr := strings.TrimPrefix(s.URL, "http://")
	for _, tt := range []struct {
		name    string
		request string
		status  int
		code    string
	}{
		{"garbage request line", "NOT A REQUEST\r\n\r\n", 400, "bad_request"},
		{"no host", "GET /v1/models HTTP/1.1\r\n\r\n", 400, "bad_request"},
		{"bad header", "GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400, "bad_request"},
		{"headers too large", "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", http.DefaultMaxHeaderBytes+8192) + "\r\n\r\n",
			431, "request_header_fields_too_large"},
		{"unknown transfer coding", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, "unsupported_transfer_encoding"},
		{"well formed", "GET /v1/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			go func() { _, _ = io.WriteString(conn, tt.request) }() // the server may answer before it has read it all
			res, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(res.Body)
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if res.StatusCode != tt.status || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") ||
				json.Unmarshal(body, &e) != nil || e.Error.Message == "" || e.Error.Type != "invalid_request_error" {
				t.Fatalf("%d %s %q, want %d with an OpenAI error", res.StatusCode, res.Header.Get("Content-Type"), body, tt.status)
			}
			if tt.code != "" && (e.Error.Code == nil || *e.Error.Code != tt.code) {
				t.Errorf("code %v, want %q", e.Error.Code, tt.code)
			}
		})
	}
}

// TestRewriteLeavesHandlersAlone: a handler's response, even a plain-text
// 400 that closes the connection, is not rewritten.
func TestRewriteLeavesHandlersAlone(t *testing.T) {
	for _, p := range []string{
		"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Tue, 01 Dec 2026 13:00:00 GMT\r\n\r\n400 Bad Request",
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nok", // not an error status
		"data: {\"x\":1}\n\n",
	} {
		if out, ok := rewriteStdlibError([]byte(p)); ok {
			t.Errorf("rewrote %q into %q", p, out)
		}
	}
}
