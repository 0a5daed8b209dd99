package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/kvroute/kvroute/internal/openai"
)

// Error types and codes the proxy answers with. Client errors are OpenAI's
// invalid_request_error; every 5xx is a server_error, its code saying which.
const (
	typeInvalidRequest = "invalid_request_error"
	typeServer         = "server_error"

	codeInvalidJSON        = "invalid_json"
	codeModelNotFound      = "model_not_found"
	codeUnknownURL         = "unknown_url"
	codeMethodNotAllowed   = "method_not_allowed"
	codeTooLarge           = "request_too_large"
	codeUnavailable        = "service_unavailable"
	codeBackendUnreachable = "backend_unreachable"
	codeBackendError       = "backend_error"
	codeInternal           = "internal_error"
)

// apiError is an error a client gets as an OpenAI-shaped JSON body,
// {"error":{"message","type","param","code"}}, with an HTTP status.
type apiError struct {
	status  int
	message string
	typ     string
	param   string // the offending request field, if known
	code    string
}

func (e *apiError) Error() string { return e.message }

// badRequest is a 400 about the request field param ("" for the body).
func badRequest(param, format string, args ...any) *apiError {
	e := &apiError{
		status:  http.StatusBadRequest,
		message: fmt.Sprintf(format, args...),
		typ:     typeInvalidRequest,
		param:   param,
	}
	if param == "" {
		e.code = codeInvalidJSON
	}
	return e
}

func modelNotFound(model string) *apiError {
	return &apiError{
		status:  http.StatusNotFound,
		message: fmt.Sprintf("The model `%s` does not exist or no backend serves it.", model),
		typ:     typeInvalidRequest,
		param:   "model",
		code:    codeModelNotFound,
	}
}

func unavailable(format string, args ...any) *apiError {
	return &apiError{
		status:  http.StatusServiceUnavailable,
		message: fmt.Sprintf(format, args...),
		typ:     typeServer,
		code:    codeUnavailable,
	}
}

func tooLarge(limit int64) *apiError {
	return &apiError{
		status:  http.StatusRequestEntityTooLarge,
		message: fmt.Sprintf("request body is larger than %d bytes", limit),
		typ:     typeInvalidRequest,
		code:    codeTooLarge,
	}
}

func unreachable(backend string, err error) *apiError {
	return &apiError{
		status:  http.StatusBadGateway,
		message: fmt.Sprintf("backend %s is unreachable: %v", backend, err),
		typ:     typeServer,
		code:    codeBackendUnreachable,
	}
}

func backendFailed(backend string, err error) *apiError {
	return &apiError{
		status:  http.StatusBadGateway,
		message: fmt.Sprintf("backend %s failed: %v", backend, err),
		typ:     typeServer,
		code:    codeBackendError,
	}
}

func internal(format string, args ...any) *apiError {
	return &apiError{
		status:  http.StatusInternalServerError,
		message: fmt.Sprintf(format, args...),
		typ:     typeServer,
		code:    codeInternal,
	}
}

// writeError sends e as the whole response.
func writeError(w http.ResponseWriter, e *apiError) {
	openai.WriteError(w, e.status, e.message, e.typ, e.param, e.code)
}

// isDialError reports whether err means the connection to the backend was
// never made (refused, unroutable, name not found, dial timeout): no byte of
// the request reached it, so another backend may safely take the request.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
