// Package openai holds what kvroute's servers share of the OpenAI API's
// wire format.
package openai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// WriteError sends an OpenAI-shaped error as the whole response:
// {"error": {"message", "type", "param", "code"}} with the given HTTP
// status; param and code are null when empty.
func WriteError(w http.ResponseWriter, status int, message, typ, param, code string) {
	e := Error{Status: status, Message: message, Type: typ, Param: param, Code: code}
	data := append(e.JSON(), '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(data)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// Error types the OpenAI API reports in error.type.
const (
	// TypeInvalidRequest is a client error: a bad field, an unknown model,
	// a missing or wrong API key.
	TypeInvalidRequest = "invalid_request_error"
	// TypeServer is a server-side failure (every 5xx).
	TypeServer = "server_error"
	// TypeRequests is OpenAI's type for a request-rate limit (429).
	TypeRequests = "requests"
)

// Error is an error a client gets as an OpenAI-shaped JSON body with an HTTP
// status. Param (the offending request field) and Code (a machine-readable
// reason) may be empty.
type Error struct {
	Status  int
	Message string
	Type    string
	Param   string
	Code    string
}

// Error returns the message.
func (e *Error) Error() string { return e.Message }

// Write sends e as the whole response, as WriteError does.
func (e *Error) Write(w http.ResponseWriter) {
	WriteError(w, e.Status, e.Message, e.Type, e.Param, e.Code)
}

// JSON is e's body: {"error": {"message", "type", "param", "code"}},
// param and code null when empty.
func (e *Error) JSON() []byte {
	type body struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	b := body{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		b.Param = &e.Param
	}
	if e.Code != "" {
		b.Code = &e.Code
	}
	data, _ := json.Marshal(struct { // strings and pointers to strings: cannot fail
		Error body `json:"error"`
	}{b})
	return data
}

// AppendEvent appends e as one server-sent event, `data: {"error":{…}}`
// and a blank line: how vLLM reports an error once a stream has started.
func (e *Error) AppendEvent(dst []byte) []byte {
	dst = append(dst, "data: "...)
	dst = append(dst, e.JSON()...)
	return append(dst, "\n\n"...)
}

// Error codes the OpenAI-compatible fronts answer with in error.code, for the
// client errors and server failures that are not a backend's own answer.
const (
	// CodeInvalidJSON is a body that is not the JSON object the endpoint
	// takes.
	CodeInvalidJSON = "invalid_json"
	// CodeModelNotFound is a model no backend serves.
	CodeModelNotFound = "model_not_found"
	// CodeTooLarge is a body over the size limit.
	CodeTooLarge = "request_too_large"
	// CodeUnavailable is a 503: no backend can take the request now.
	CodeUnavailable = "service_unavailable"
	// CodeInternal is a 500 of the front itself.
	CodeInternal = "internal_error"
)

// BadRequest is a 400 about the request field param ("" for the body as a
// whole, which is then reported as invalid JSON).
func BadRequest(param, format string, args ...any) *Error {
	e := &Error{
		Status:  http.StatusBadRequest,
		Message: fmt.Sprintf(format, args...),
		Type:    TypeInvalidRequest,
		Param:   param,
	}
	if param == "" {
		e.Code = CodeInvalidJSON
	}
	return e
}

// ModelNotFound is the 404 for a model no backend serves.
func ModelNotFound(model string) *Error {
	return &Error{
		Status:  http.StatusNotFound,
		Message: fmt.Sprintf("The model `%s` does not exist or no backend serves it.", model),
		Type:    TypeInvalidRequest,
		Param:   "model",
		Code:    CodeModelNotFound,
	}
}

// Unavailable is a 503: no backend can take the request now.
func Unavailable(format string, args ...any) *Error {
	return &Error{
		Status:  http.StatusServiceUnavailable,
		Message: fmt.Sprintf(format, args...),
		Type:    TypeServer,
		Code:    CodeUnavailable,
	}
}

// TooLarge is the 413 for a body over limit bytes.
func TooLarge(limit int64) *Error {
	return &Error{
		Status:  http.StatusRequestEntityTooLarge,
		Message: fmt.Sprintf("request body is larger than %d bytes", limit),
		Type:    TypeInvalidRequest,
		Code:    CodeTooLarge,
	}
}

// Internal is a 500: the front itself failed.
func Internal(format string, args ...any) *Error {
	return &Error{
		Status:  http.StatusInternalServerError,
		Message: fmt.Sprintf(format, args...),
		Type:    TypeServer,
		Code:    CodeInternal,
	}
}
