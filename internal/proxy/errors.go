package proxy

import (
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/kvroute/kvroute/internal/anthropic"
	"github.com/kvroute/kvroute/internal/openai"
)

// Error types and codes the proxy answers with, beside openai's. Client
// errors are OpenAI's invalid_request_error; every 5xx is a server_error,
// its code saying which.
const (
	typeInvalidRequest = openai.TypeInvalidRequest
	typeServer         = openai.TypeServer

	codeInvalidJSON        = openai.CodeInvalidJSON
	codeModelNotFound      = openai.CodeModelNotFound
	codeUnknownURL         = "unknown_url"
	codeMethodNotAllowed   = "method_not_allowed"
	codeTooLarge           = openai.CodeTooLarge
	codeUnavailable        = openai.CodeUnavailable
	codeBackendUnreachable = "backend_unreachable"
	codeBackendError       = "backend_error"
	codeBackendTimeout     = "backend_timeout"
	codeRequestTimeout     = "request_timeout"
)

// apiError is an error a client gets as an OpenAI-shaped JSON body,
// {"error":{"message","type","param","code"}}, with an HTTP status: the
// one type the emulator answers with too.
type apiError = openai.Error

// writeError sends e as the whole response, in the shape of the API the
// client speaks (messages.go).
func writeError(w http.ResponseWriter, e *apiError) {
	if speaksMessages(w) {
		anthropic.WriteError(w, e)
		return
	}
	e.Write(w)
}

// notFound is the 404 of a path the proxy does not serve.
func notFound(r *http.Request) *apiError {
	return &apiError{
		Status:  http.StatusNotFound,
		Message: "Invalid URL (" + r.Method + " " + r.URL.Path + ")",
		Type:    typeInvalidRequest,
		Code:    codeUnknownURL,
	}
}

// isDialError reports whether err means the connection to the backend was
// never made (refused, unroutable, name not found, dial timeout): no byte of
// the request reached it, so another backend may safely take the request.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// reject answers a request that goes to no backend with e, and counts it.
func (p *Proxy) reject(w http.ResponseWriter, e *apiError) { p.rejectFor(w, e, "") }

// rejectFor is reject for a request for model ("" if unknown).
func (p *Proxy) rejectFor(w http.ResponseWriter, e *apiError, model string) {
	p.metrics.requests.WithLabelValues(noBackend, statusLabel(e.Status), noBackend, p.modelLabel(model)).Inc()
	writeError(w, e)
}

// writeText answers with a plain-text body.
func writeText(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}
