package server

import (
	"bytes"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/rawsock"
)

// net/http answers a request it cannot read (a malformed request line or
// header, headers past MaxHeaderBytes, an unknown transfer coding) by
// itself, before any handler runs: one write of a plain-text response
// straight to the connection, then it closes it. Clients of an OpenAI API
// expect a JSON error body. openAIErrors wraps the listener's connections
// so that such a write goes out as the same status with an OpenAI-shaped
// JSON body. The write is recognised by the header block net/http uses for
// it alone: Content-Type before Connection, no Date. Responses from
// handlers always have their headers sorted (Connection first) and a Date,
// so no handler's response can look like it.
//
// Only plain-text listeners are wrapped: net/http needs the *tls.Conn itself
// to run TLS and HTTP/2, and a wrapper below TLS sees ciphertext. With
// --tls-cert those answers stay plain text.
const stdlibErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// openAIErrors wraps ln's connections (see stdlibErrorHeaders).
// With raw set, the connections are also read and written with raw system
// calls (internal/rawsock).
func openAIErrors(ln net.Listener, raw bool) net.Listener { return errorsListener{ln, raw} }

type errorsListener struct {
	net.Listener
	raw bool
}

func (l errorsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if l.raw {
		c = rawsock.Wrap(c)
	}
	return errorsConn{c}, nil
}

type errorsConn struct{ net.Conn }

// Write sends p, or its JSON rewrite when p is net/http's own answer to a
// request it could not read. It reports len(p) written when the rewrite
// went out whole.
func (c errorsConn) Write(p []byte) (int, error) {
	if out, ok := rewriteStdlibError(p); ok {
		if _, err := c.Conn.Write(out); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// rewriteStdlibError returns the OpenAI-shaped response for p if p is one
// of net/http's plain-text answers: "HTTP/1.1 CODE REASON[: DETAIL]",
// stdlibErrorHeaders, a body.
func rewriteStdlibError(p []byte) ([]byte, bool) {
	rest, ok := bytes.CutPrefix(p, []byte("HTTP/1.1 "))
	if !ok {
		return nil, false
	}
	i := bytes.IndexByte(rest, '\r')
	if i < 4 || !bytes.HasPrefix(rest[i:], []byte(stdlibErrorHeaders)) {
		return nil, false
	}
	status, err := strconv.Atoi(string(rest[:3]))
	if err != nil || status < 400 || status > 599 {
		return nil, false
	}
	e := stdlibError(status, string(rest[4:i]))
	body := append(e.JSON(), '\n')
	var out []byte
	out = append(out, "HTTP/1.1 "+strconv.Itoa(status)+" "+http.StatusText(status)+"\r\n"...)
	out = append(out, "Content-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n"...)
	out = append(out, "Connection: close\r\nX-Content-Type-Options: nosniff\r\n\r\n"...)
	return append(out, body...), true
}

// stdlibError is the OpenAI error for net/http's answer status with the
// reason phrase reason ("Bad Request: missing required Host header").
func stdlibError(status int, reason string) *openai.Error {
	e := &openai.Error{Status: status, Type: openai.TypeInvalidRequest, Code: "bad_request",
		Message: "malformed HTTP request: the request line or a header could not be parsed"}
	if _, detail, ok := strings.Cut(reason, ": "); ok && detail != "" {
		e.Message = "malformed HTTP request: " + detail
	}
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		e.Code, e.Message = "request_header_fields_too_large", "request headers are larger than kvroute accepts"
	case http.StatusNotImplemented:
		e.Code, e.Message = "unsupported_transfer_encoding", "unsupported transfer encoding"
	case http.StatusHTTPVersionNotSupported:
		e.Code = "http_version_not_supported"
	}
	return e
}
