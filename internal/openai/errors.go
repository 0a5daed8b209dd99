// Package openai holds what kvroute's servers share of the OpenAI API's
// wire format.
package openai

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// WriteError sends an OpenAI-shaped error as the whole response:
// {"error": {"message", "type", "param", "code"}} with the given HTTP
// status; param and code are null when empty.
func WriteError(w http.ResponseWriter, status int, message, typ, param, code string) {
	type body struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	b := body{Message: message, Type: typ}
	if param != "" {
		b.Param = &param
	}
	if code != "" {
		b.Code = &code
	}
	data, _ := json.Marshal(struct { // strings and pointers to strings: cannot fail
		Error body `json:"error"`
	}{b})
	data = append(data, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(data)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}
