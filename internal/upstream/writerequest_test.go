package upstream

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
)

// writeRequest writes what req.Write writes, byte for byte, whether it
// takes its own path or hands the request to req.Write.
func TestWriteRequestAsNetHTTP(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
	many := http.Header{}
	for i := range 40 {
		many.Set("X-H-"+strconv.Itoa(i), "v"+strconv.Itoa(i))
	}
	for _, tt := range []struct {
		name    string
		backend string
		target  string
		header  http.Header
		body    []byte
		ctx     func(*http.Request) *http.Request
	}{
		{name: "chat", backend: "http://10.0.0.1:8000", target: "/v1/chat/completions",
			header: http.Header{"Content-Type": {"application/json"}, "X-Session-Id": {"u-7"}, "Accept": {"a", "b"},
				"Authorization": {"Bearer k"}, "Connection": {"keep-alive, X-Drop"}, "X-Drop": {"x"}}, body: body},
		{name: "user agent", backend: "http://b:80", target: "/v1/completions",
			header: http.Header{"User-Agent": {"  curl/8  "}}, body: body},
		{name: "blank user agent", backend: "http://b:80", target: "/v1/completions",
			header: http.Header{"User-Agent": {""}}, body: body},
		{name: "query and escapes", backend: "http://b:80/prefix", target: "/v1/a%20b?x=1&y=%2F",
			header: http.Header{"X-Trailing": {" v  "}, "x-lower": {"raw key"}, "Bad Key": {"dropped"}}, body: body},
		{name: "ipv6", backend: "http://[::1]:9000", target: "/v1/chat/completions", header: http.Header{}, body: body},
		{name: "many headers", backend: "http://b:80", target: "/v1/chat/completions", header: many, body: body},
		{name: "no body", backend: "http://b:80", target: "/v1/models", header: http.Header{}},
		{name: "line break", backend: "http://b:80", target: "/v1/chat/completions",
			header: http.Header{"X-Odd": {"a\nb"}}, body: body},
		{name: "zone", backend: "http://[fe80::1%25eth0]:80", target: "/v1/chat/completions", header: http.Header{}, body: body},
	} {
		t.Run(tt.name, func(t *testing.T) {
			be, err := fleet.ParseBackend(0, "b="+tt.backend)
			if err != nil {
				t.Fatal(err)
			}
			method := http.MethodPost
			if tt.body == nil {
				method = http.MethodGet
			}
			in := httptest.NewRequest(method, tt.target, nil)
			in.Header = tt.header
			build := func() *http.Request { return NewRequest(context.Background(), in, be.URL, tt.body) }
			var want, got bytes.Buffer
			if err := build().Write(&want); err != nil {
				t.Fatal(err)
			}
			w := bufio.NewWriter(&got)
			if err := writeRequest(w, build()); err != nil {
				t.Fatal(err)
			}
			w.Flush()
			if got.String() != want.String() {
				t.Errorf("writeRequest wrote\n%q\nreq.Write writes\n%q", got.String(), want.String())
			}
		})
	}
}

// The request line, headers and body of a request to a backend go out
// without an allocation.
func TestWriteRequestAllocatesNothing(t *testing.T) {
	be, _ := fleet.ParseBackend(0, "b=http://10.0.0.1:8000")
	in := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	in.Header = http.Header{"Content-Type": {"application/json"}, "X-Session-Id": {"u-7"}}
	body := []byte(strings.Repeat("x", 600))
	req := NewRequest(context.Background(), in, be.URL, body)
	w := bufio.NewWriterSize(new(discardWriter), 8<<10)
	ub := req.Body.(*Body)
	if n := testing.AllocsPerRun(100, func() {
		ub.Reset(body)
		if err := writeRequest(w, req); err != nil {
			t.Fatal(err)
		}
		_ = w.Flush()
	}); n != 0 {
		t.Errorf("writeRequest allocates %v times, want 0", n)
	}
}

type discardWriter struct{}

func (*discardWriter) Write(p []byte) (int, error) { return len(p), nil }
