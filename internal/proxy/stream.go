package proxy

import (
	"io"
	"net/http"
	"strings"

	"github.com/kvroute/kvroute/internal/sse"
	"github.com/kvroute/kvroute/internal/upstream"
)

// responseHeaders readies a backend's response headers for the client: hop
// headers out, no length on a stream (events may be dropped or edited), its
// trailers announced. It reports whether the response is an event stream,
// and how many trailers were announced.
func responseHeaders(res *http.Response) (stream bool, announced int) {
	upstream.RemoveHopHeaders(res.Header)
	stream = sse.IsEventStream(res.Header.Get("Content-Type"))
	if stream {
		res.Header.Del("Content-Length")
	}
	announced = len(res.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range res.Trailer {
			keys = append(keys, k)
		}
		res.Header.Add("Trailer", strings.Join(keys, ", "))
	}
	return stream, announced
}

// copyTrailers sends a response's trailers as httputil.ReverseProxy does:
// those announced in the header under their names, others (the backend
// added them after its headers) with the TrailerPrefix.
func copyTrailers(h, trailer http.Header, announced int) {
	prefix := ""
	if len(trailer) != announced {
		prefix = http.TrailerPrefix
	}
	for k, vv := range trailer {
		h[prefix+k] = vv
	}
}

// heldWriter holds a response's status and headers until its first byte is
// written: until then nothing has reached the client and the request may
// still go to another backend.
type heldWriter struct {
	http.ResponseWriter
	status int
	header http.Header // copied into the response's headers when sent
	sent   bool
	// onSend, when set, has its retry of the budget given back when the
	// response is sent (the attempt has answered): the attempt itself,
	// where a closure would be an allocation a request.
	onSend *attempt
}

func (h *heldWriter) send() {
	if h.sent {
		return
	}
	h.sent = true
	if a := h.onSend; a != nil {
		a.p.retried(a.c)
	}
	dst := h.ResponseWriter.Header()
	for k, vv := range h.header {
		dst[k] = vv
	}
	h.ResponseWriter.WriteHeader(h.status)
}

func (h *heldWriter) Write(b []byte) (int, error) {
	h.send()
	return h.ResponseWriter.Write(b)
}

// FlushError flushes what was written; before anything was, there is
// nothing to flush (and the headers stay held).
func (h *heldWriter) FlushError() error {
	if !h.sent {
		return nil
	}
	// net/http's own writer flushes without the controller's allocation,
	// once per read of a stream.
	if f, ok := h.ResponseWriter.(interface{ FlushError() error }); ok {
		return f.FlushError()
	}
	return http.NewResponseController(h.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection.
func (h *heldWriter) Unwrap() http.ResponseWriter { return h.ResponseWriter }

// idleReader notes every read that brings bytes once the first token is in,
// for the attempt's idle timeout.
type idleReader struct {
	r io.Reader
	a *attempt
}

func (ir idleReader) Read(b []byte) (int, error) {
	n, err := ir.r.Read(b)
	if n > 0 && ir.a.first {
		ir.a.wd.touch()
	}
	return n, err
}

// push pushes the body if it can be, noting every push of bytes as Read
// notes reads.
func (ir idleReader) push(s upstream.Sink) (bool, error) {
	p, ok := ir.r.(upstream.Pusher)
	if !ok {
		return false, nil
	}
	ir.a.sink = idleSink{s: s, a: ir.a} // in the attempt: boxed on its own, it would be allocated
	return p.Push(&ir.a.sink)
}

// idleSink is idleReader's sink.
type idleSink struct {
	s upstream.Sink
	a *attempt
}

func (is idleSink) Space() ([]byte, error) { return is.s.Space() }

func (is idleSink) Took(n int, more bool) error {
	if is.a.first {
		is.a.wd.touch()
	}
	return is.s.Took(n, more)
}
