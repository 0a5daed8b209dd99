package openai

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestError(t *testing.T) {
	tests := []struct {
		name string
		e    Error
		want string
	}{
		{"all fields", Error{Status: 400, Message: "bad", Type: TypeInvalidRequest, Param: "model", Code: "x"},
			`{"error":{"message":"bad","type":"invalid_request_error","param":"model","code":"x"}}`},
		{"nulls", Error{Status: 500, Message: `a "quote"`, Type: TypeServer},
			`{"error":{"message":"a \"quote\"","type":"server_error","param":null,"code":null}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			tt.e.Write(w)
			if w.Code != tt.e.Status || strings.TrimSpace(w.Body.String()) != tt.want ||
				w.Header().Get("Content-Type") != "application/json" {
				t.Errorf("Write: %d %q %q", w.Code, w.Header().Get("Content-Type"), w.Body)
			}
			ev := string(tt.e.AppendEvent([]byte("x")))
			if ev != "xdata: "+tt.want+"\n\n" {
				t.Errorf("AppendEvent = %q", ev)
			}
			if !json.Valid([]byte(tt.want)) {
				t.Fatalf("want %s is not JSON", tt.want)
			}
			if tt.e.Error() != tt.e.Message {
				t.Errorf("Error() = %q, want the message", tt.e.Error())
			}
		})
	}
}
