package emulator

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/kvroute/kvroute/internal/anthropic"
	"github.com/kvroute/kvroute/internal/openai"
)

// badRequest is a 400 invalid_request_error about param.
func badRequest(param, format string, args ...any) *openai.Error {
	return &openai.Error{
		Status:  http.StatusBadRequest,
		Message: fmt.Sprintf(format, args...),
		Type:    openai.TypeInvalidRequest,
		Param:   param,
	}
}

// writeError sends e as the whole response, in the shape of the API the
// client speaks (messages.go).
func writeError(w http.ResponseWriter, e *openai.Error) {
	if _, ok := w.(messagesWriter); ok {
		anthropic.WriteError(w, e)
		return
	}
	e.Write(w)
}

// writeJSON sends v as a JSON response with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		// Only our own response types get here, and they always encode.
		http.Error(w, "internal error encoding response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}
