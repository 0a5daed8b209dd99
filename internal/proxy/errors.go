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
	codeBackendTimeout     = "backend_timeout"
	codeRequestTimeout     = "request_timeout"
)

// apiError is an error a client gets as an OpenAI-shaped JSON body,
// {"error":{"message","type","param","code"}}, with an HTTP status: the
// one type the emulator answers with too.
type apiError = openai.Error

// badRequest is a 400 about the request field param ("" for the body).
func badRequest(param, format string, args ...any) *apiError {
	e := &apiError{
		Status:  http.StatusBadRequest,
		Message: fmt.Sprintf(format, args...),
		Type:    typeInvalidRequest,
		Param:   param,
	}
	if param == "" {
		e.Code = codeInvalidJSON
	}
	return e
}

func modelNotFound(model string) *apiError {
	return &apiError{
		Status:  http.StatusNotFound,
		Message: fmt.Sprintf("The model `%s` does not exist or no backend serves it.", model),
		Type:    typeInvalidRequest,
		Param:   "model",
		Code:    codeModelNotFound,
	}
}

func unavailable(format string, args ...any) *apiError {
	return &apiError{
		Status:  http.StatusServiceUnavailable,
		Message: fmt.Sprintf(format, args...),
		Type:    typeServer,
		Code:    codeUnavailable,
	}
}

func tooLarge(limit int64) *apiError {
	return &apiError{
		Status:  http.StatusRequestEntityTooLarge,
		Message: fmt.Sprintf("request body is larger than %d bytes", limit),
		Type:    typeInvalidRequest,
		Code:    codeTooLarge,
	}
}

func unreachable(backend string, err error) *apiError {
	return &apiError{
		Status:  http.StatusBadGateway,
		Message: fmt.Sprintf("backend %s is unreachable: %v", backend, err),
		Type:    typeServer,
		Code:    codeBackendUnreachable,
	}
}

func backendFailed(backend string, err error) *apiError {
	return &apiError{
		Status:  http.StatusBadGateway,
		Message: fmt.Sprintf("backend %s failed: %v", backend, err),
		Type:    typeServer,
		Code:    codeBackendError,
	}
}

func internal(format string, args ...any) *apiError {
	return &apiError{
		Status:  http.StatusInternalServerError,
		Message: fmt.Sprintf(format, args...),
		Type:    typeServer,
		Code:    codeInternal,
	}
}

// writeError sends e as the whole response.
func writeError(w http.ResponseWriter, e *apiError) { e.Write(w) }

// isDialError reports whether err means the connection to the backend was
// never made (refused, unroutable, name not found, dial timeout): no byte of
// the request reached it, so another backend may safely take the request.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
