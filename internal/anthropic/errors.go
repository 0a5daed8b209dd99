// Package anthropic holds what kvroute's servers share of Anthropic's
// Messages API wire format: its error body and error event, made from the
// same openai.Error the rest of kvroute answers with, so that a failure is
// described once and shaped for the API the client speaks.
package anthropic

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/kvroute/kvroute/internal/openai"
)

// Error types of the Messages API, by the HTTP status they come with
// (Anthropic's API reference, "Errors").
const (
	TypeInvalidRequest = "invalid_request_error" // 400, and other 4xx
	TypeAuthentication = "authentication_error"  // 401
	TypePermission     = "permission_error"      // 403
	TypeNotFound       = "not_found_error"       // 404
	TypeTooLarge       = "request_too_large"     // 413
	TypeRateLimit      = "rate_limit_error"      // 429
	TypeAPI            = "api_error"             // 500, and other 5xx
	TypeOverloaded     = "overloaded_error"      // 529 (and kvroute's 503)
	TypeTimeout        = "timeout_error"         // 504
)

// StatusOverloaded is Anthropic's own status for an API that is
// overloaded; kvroute answers 503 where it has no backend to offer, as on
// its other paths, and only the error type says "overloaded".
const StatusOverloaded = 529

// ErrorType is the Messages API's error type for an HTTP status.
func ErrorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return TypeAuthentication
	case http.StatusForbidden:
		return TypePermission
	case http.StatusNotFound:
		return TypeNotFound
	case http.StatusRequestEntityTooLarge:
		return TypeTooLarge
	case http.StatusTooManyRequests:
		return TypeRateLimit
	case http.StatusServiceUnavailable, StatusOverloaded:
		return TypeOverloaded
	case http.StatusGatewayTimeout:
		return TypeTimeout
	}
	if status >= 500 {
		return TypeAPI
	}
	return TypeInvalidRequest
}

// ErrorJSON is e as the Messages API's error body:
// {"type":"error","error":{"type","message"}}, the type from e's status.
func ErrorJSON(e *openai.Error) []byte {
	type detail struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	data, _ := json.Marshal(struct { // strings only: cannot fail
		Type  string `json:"type"`
		Error detail `json:"error"`
	}{"error", detail{ErrorType(e.Status), e.Message}})
	return data
}

// WriteError sends e as the whole response, in the Messages API's shape,
// with e's status.
func WriteError(w http.ResponseWriter, e *openai.Error) {
	data := append(ErrorJSON(e), '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(data)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(e.Status)
	_, _ = w.Write(data)
}

// AppendEvent appends e as the Messages API's error event, `event: error`
// and `data: {"type":"error","error":{…}}`: how a stream that has started
// reports a failure. No event follows it.
func AppendEvent(dst []byte, e *openai.Error) []byte {
	dst = append(dst, "event: error\ndata: "...)
	dst = append(dst, ErrorJSON(e)...)
	return append(dst, "\n\n"...)
}
