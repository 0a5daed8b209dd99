package emulator

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/kvroute/kvroute/internal/openai"
)

// apiError is an error the client gets as an OpenAI-shaped JSON body:
// {"error": {"message", "type", "param", "code"}}.
type apiError struct {
	status  int
	message string
	typ     string
	param   string // the offending request field, if known
	code    string // machine-readable reason, if any
}

func (e *apiError) Error() string { return e.message }

// badRequest is a 400 invalid_request_error about param.
func badRequest(param, format string, args ...any) *apiError {
	return &apiError{
		status:  http.StatusBadRequest,
		message: fmt.Sprintf(format, args...),
		typ:     "invalid_request_error",
		param:   param,
	}
}

// writeError sends e as the whole response.
func writeError(w http.ResponseWriter, e *apiError) {
	openai.WriteError(w, e.status, e.message, e.typ, e.param, e.code)
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
