package proxy

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"unsafe"
)

// HeaderRequestID carries a request's ID: taken from the client when it
// sends one, made up otherwise, sent upstream to the backend (vLLM names
// its request after it) and returned in the response, so that one ID finds
// a request in the client's, the router's and the backend's logs.
const HeaderRequestID = "X-Request-Id"

// maxRequestIDLen bounds a client's request ID: a UUID is 36 characters,
// a W3C trace ID 32; longer IDs are replaced rather than logged.
const maxRequestIDLen = 128

// tagRequest gives r its request ID: the client's X-Request-Id if it is
// one (1 to maxRequestIDLen printable ASCII characters without spaces),
// else a new random one. The ID is set on r's headers, so that it goes
// upstream with them, and on the response's.
func tagRequest(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(HeaderRequestID)
	if validRequestID(id) {
		w.Header().Set(HeaderRequestID, id)
		return
	}
	// One allocation for both headers' values (HeaderRequestID is in
	// canonical form): they are never appended to.
	vv := []string{newRequestID(), ""}
	vv[1] = vv[0]
	r.Header[HeaderRequestID], w.Header()[HeaderRequestID] = vv[:1:1], vv[1:]
}

// requestID is r's request ID, as tagRequest set it.
func requestID(r *http.Request) string { return r.Header.Get(HeaderRequestID) }

// validRequestID reports whether a client's request ID may be kept: short,
// printable, no spaces, so that it reads as one token in every log format.
func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for i := range len(id) {
		if c := id[i]; c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// newRequestID returns 16 random bytes in hex (32 characters, the shape of
// a W3C trace ID). crypto/rand never fails on the platforms Go supports.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	// hex.EncodeToString would allocate twice (its buffer, then the
	// string); the buffer becomes the string, never written again.
	id := make([]byte, hex.EncodedLen(len(b)))
	hex.Encode(id, b[:])
	return unsafe.String(&id[0], len(id))
}
