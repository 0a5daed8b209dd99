package anthropic

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/openai"
)

func TestErrorType(t *testing.T) {
	tests := []struct {
		status int
		want   string
	}{
		{400, TypeInvalidRequest}, {405, TypeInvalidRequest}, {408, TypeInvalidRequest},
		{401, TypeAuthentication}, {403, TypePermission}, {404, TypeNotFound},
		{413, TypeTooLarge}, {429, TypeRateLimit}, {500, TypeAPI}, {502, TypeAPI},
		{503, TypeOverloaded}, {529, TypeOverloaded}, {504, TypeTimeout},
	}
	for _, tt := range tests {
		if got := ErrorType(tt.status); got != tt.want {
			t.Errorf("ErrorType(%d) = %q, want %q", tt.status, got, tt.want)
		}
	}
}

func TestWriteError(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteError(rec, openai.ModelNotFound("m"))
	if rec.Code != http.StatusNotFound || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	var body struct {
		Type  string `json:"type"`
		Error struct {
			Type, Message string
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body.Type != "error" || body.Error.Type != TypeNotFound || !strings.Contains(body.Error.Message, "`m`") {
		t.Errorf("body %s", rec.Body)
	}
}

func TestAppendEvent(t *testing.T) {
	got := string(AppendEvent(nil, openai.Unavailable("no backend")))
	want := "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"no backend\"}}\n\n"
	if got != want {
		t.Errorf("event %q, want %q", got, want)
	}
}
