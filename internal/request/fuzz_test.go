package request

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/kvroute/kvroute/internal/openai"
)

// The fuzz target's seed corpus is under testdata/fuzz/FuzzParseGeneration;
// CI runs it for a few seconds (.ci/run).

// chatBody is a small chat request.
const chatBody = `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there"}],"max_tokens":8}`

// FuzzParseGeneration feeds request bodies to the chat and completion
// parser, and the chat bodies to the Responses and Messages API parsers
// too. It must not
// panic; it either accepts the body with a model, or refuses it with a 4xx
// OpenAI error; and when it asks the backend for the usage chunk the body
// it sends stays valid JSON.
func FuzzParseGeneration(f *testing.F) {
	f.Add([]byte(chatBody), true, "")
	f.Add([]byte(`{"model":"m","prompt":["a","b"],"max_tokens":3,"stream":true}`), false, "s")
	f.Add([]byte(`{"model":"m","instructions":"S","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},`+
		`{"type":"function_call","call_id":"c","arguments":"{}"}],"previous_response_id":"r","metadata":{"session_id":"s"}}`), true, "")
	f.Add([]byte(`{"model":"m","max_tokens":9,"system":[{"type":"text","text":"S"}],"tools":[{"name":"t","input_schema":{}}],`+
		`"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"x","content":[{"type":"image","source":{}}]}]}],`+
		`"metadata":{"user_id":"u"},"stream":true}`), true, "")
	f.Fuzz(func(t *testing.T, body []byte, chat bool, session string) {
		ep := Completion
		if chat {
			ep = Chat
		}
		fuzzGeneration(t, ep, body, session)
		if chat {
			fuzzGeneration(t, Responses, body, session)
			fuzzGeneration(t, Messages, body, session)
		}
	})
}

// fuzzGeneration checks parseGeneration's result for one body at ep.
func fuzzGeneration(t *testing.T, ep Endpoint, body []byte, session string) {
	t.Helper()
	g, e := Parse(ep, body, session)
	if e != nil {
		if g != nil {
			t.Fatal("both a result and an error")
		}
		assertAPIError(t, e)
		return
	}
	if g.Request.Model == "" {
		t.Fatalf("accepted %q without a model", body)
	}
	if g.Request.MaxTokens < 0 {
		t.Fatalf("max tokens %d", g.Request.MaxTokens)
	}
	if g.Stream && !g.IncludeUsage {
		out, _ := WithIncludeUsage(body)
		if json.Valid(body) && !json.Valid(out) {
			t.Fatalf("WithIncludeUsage(%q) = %q, not JSON", body, out)
		}
	}
}

// assertAPIError checks that e is a client error that renders as an
// OpenAI-shaped body.
func assertAPIError(t *testing.T, e *openai.Error) {
	t.Helper()
	if e.Status < 400 || e.Status > 499 || e.Type != openai.TypeInvalidRequest || e.Message == "" {
		t.Fatalf("error %+v is not a client error", e)
	}
	rec := httptest.NewRecorder()
	e.Write(rec)
	var got struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got.Error == nil || got.Error.Message != e.Message {
		t.Fatalf("error body %q is not OpenAI-shaped: %v", rec.Body, err)
	}
}
