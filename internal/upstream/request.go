package upstream

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// NewRequest builds the request to the backend at base for the client's
// request in, with body as its body, bound to ctx: in's path and query
// under base's path, in's headers without the hop-by-hop ones, and
// X-Forwarded-For. The lean path writes it without allocating
// (writeRequest).
func NewRequest(ctx context.Context, in *http.Request, base *url.URL, body []byte) *http.Request {
	u := *base
	u.Path = joinPath(base.Path, in.URL.Path)
	u.RawPath = ""
	u.RawQuery = in.URL.RawQuery
	u.Fragment = ""
	// As http.NewRequestWithContext makes it, without parsing a URL and
	// making a header only to replace them; the method was valid on the
	// way in.
	out := (&http.Request{Method: in.Method, URL: &u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}).WithContext(ctx)
	if len(body) > 0 {
		out.Body, out.ContentLength = NewBody(body), int64(len(body))
		// The transport may resend it on a stale connection.
		out.GetBody = func() (io.ReadCloser, error) { return NewBody(body), nil }
	}

	out.Header = in.Header.Clone()
	RemoveHopHeaders(out.Header)
	if wantsTrailers(in.Header) {
		out.Header.Set("Te", "trailers")
	}
	// The proxy reads usage from the bodies: ask for them uncompressed.
	out.Header.Del("Accept-Encoding")
	out.Header.Del("Content-Length")
	out.Header.Del("Expect") // the body is here already
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header.Set("User-Agent", "") // not Go's default
	}
	if ip, _, err := net.SplitHostPort(in.RemoteAddr); err == nil {
		if prior := out.Header.Values("X-Forwarded-For"); len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		out.Header.Set("X-Forwarded-For", ip)
	}
	// A kept-alive connection the backend closed while idle fails the
	// request before the backend read it (llama-server closes them after 5
	// s); the transport resends only requests it may repeat. This one it
	// may: an empty key marks it so without sending the header.
	_, key := out.Header["Idempotency-Key"]
	_, xkey := out.Header["X-Idempotency-Key"]
	if !key && !xkey {
		out.Header["X-Idempotency-Key"] = nil
	}
	return out
}

// Body is the body of a request to a backend: in memory, which the lean
// path writes as it is (writeRequest).
type Body struct{ bytes.Reader }

// NewBody returns b as a request body.
func NewBody(b []byte) *Body {
	u := new(Body)
	u.Reset(b)
	return u
}

// Close implements io.Closer; there is nothing to release.
func (*Body) Close() error { return nil }

// joinPath puts the request path under the backend URL's path prefix.
func joinPath(prefix, path string) string {
	prefix = strings.TrimSuffix(prefix, "/")
	if prefix == "" {
		return path
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return prefix + path
}

// hopHeaders are the hop-by-hop headers, as httputil.ReverseProxy lists
// them: they concern one connection, not the request.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// RemoveHopHeaders removes the hop-by-hop headers from h, and the headers
// its Connection header names.
func RemoveHopHeaders(h http.Header) {
	for _, f := range h["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = strings.TrimSpace(sf); sf != "" {
				h.Del(sf)
			}
		}
	}
	for _, f := range hopHeaders {
		h.Del(f)
	}
}

func wantsTrailers(h http.Header) bool {
	for _, v := range h["Te"] {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "trailers") {
				return true
			}
		}
	}
	return false
}

// writeRequest writes req to w as req.Write does, byte for byte, for the
// requests the proxy makes (NewRequest: a body in memory, no trailers,
// no tracing hooks, a plain host); others it hands to req.Write. req.Write
// formats the request line and the Host and User-Agent lines with fmt,
// and sends the body through a transfer writer and a LimitReader: six
// allocations a request, where this makes none.
func writeRequest(w *bufio.Writer, req *http.Request) error {
	body, ok := req.Body.(*Body)
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
