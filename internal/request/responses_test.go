package request

import (
	"net/http"
	"strings"
	"testing"
)

func TestRenderResponses(t *testing.T) {
	tests := []struct {
		name string
		body string // members after "model"
		want string
	}{
		{
			name: "string input is one user message",
			body: `"input":"Hi"`,
			want: "user\nHi\n",
		},
		{
			name: "instructions are a system message first",
			body: `"input":"Hi","instructions":"Be brief."`,
			want: "system\nBe brief.\nuser\nHi\n",
		},
		{
			name: "message items, string and part contents",
			body: `"input":[{"role":"user","content":"Hi"},
				{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hello","annotations":[]}]},
				{"role":"user","content":[{"type":"input_text","text":"look"},{"type":"text","text":"here"}]}]`,
			want: "user\nHi\nassistant\nHello\nuser\nlook\nhere\n",
		},
		{
			name: "other items as their type and compact JSON",
			body: `"input":[{"role":"user","content":"add"},
				{"type":"function_call","call_id":"c1","name":"add","arguments":"{\"a\": 1}"},
				{"type":"function_call_output", "call_id":"c1", "output":"2"}]`,
			want: "user\nadd\n" +
				"function_call\n" + `{"type":"function_call","call_id":"c1","name":"add","arguments":"{\"a\": 1}"}` + "\n" +
				"function_call_output\n" + `{"type":"function_call_output","call_id":"c1","output":"2"}` + "\n",
		},
		{
			name: "no input",
			body: `"previous_response_id":"resp_1","instructions":"S"`,
			want: "system\nS\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, e := Parse(Responses, []byte(`{"model":"m",`+tt.body+`}`), "")
			if e != nil {
				t.Fatal(e)
			}
			if g.Request.Prompt != tt.want {
				t.Errorf("Prompt = %q, want %q", g.Request.Prompt, tt.want)
			}
		})
	}
}

// TestResponsesKeepChatPrefix: a conversation that moves from chat to
// responses renders the same prefix.
func TestResponsesKeepChatPrefix(t *testing.T) {
	chat := chatPrompt(t, `{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"Hi"},
		{"role":"assistant","content":"Hello"}]}`)
	g, e := Parse(Responses, []byte(`{"model":"m","instructions":"S","input":[
		{"role":"user","content":[{"type":"input_text","text":"Hi"}]},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hello"}]},
		{"role":"user","content":"More"}]}`), "")
	if e != nil {
		t.Fatal(e)
	}
	if !strings.HasPrefix(g.Request.Prompt, chat) {
		t.Errorf("responses prompt %q does not extend the chat prompt %q", g.Request.Prompt, chat)
	}
}

func TestResponsesFacts(t *testing.T) {
	g, e := Parse(Responses, []byte(`{"model":"m","input":"x","max_output_tokens":7,"max_tokens":3,"stream":true}`), "")
	if e != nil {
		t.Fatal(e)
	}
	if g.Request.Model != "m" || g.Request.MaxTokens != 7 || !g.Stream {
		t.Errorf("facts %+v stream %v, want model m, max 7, streamed", g.Request, g.Stream)
	}
	for _, body := range []string{
		`{"model":"m","input":3}`,
		`{"model":"m","input":["a"]}`,
		`{"model":"m","input":"x","instructions":1}`,
		`{"input":"x"}`,
	} {
		if _, e := Parse(Responses, []byte(body), ""); e == nil || e.Status != http.StatusBadRequest {
			t.Errorf("%s: error %v, want a 400", body, e)
		}
	}
}

func TestSessionKeyOrder(t *testing.T) {
	all := `"prompt_cache_key":"pck","previous_response_id":"resp_1","safety_identifier":"safe","user":"u",` +
		`"metadata":{"session_id":"ms","conversation_id":"mc"}`
	tests := []struct {
		ep      Endpoint
		header  string
		members string
		want    string
	}{
		{Responses, "hdr", all, "hdr"},
		{Responses, "", all, "pck"},
		{Responses, "", `"previous_response_id":"resp_1","safety_identifier":"safe","user":"u"`, "resp_1"},
		{Responses, "", `"safety_identifier":"safe","user":"u"`, "safe"},
		{Responses, "", `"user":"u","metadata":{"session_id":"ms"}`, "u"},
		{Responses, "", `"metadata":{"session_id":"ms","conversation_id":"mc"}`, "ms"},
		{Responses, "", `"metadata":{"conversation_id":"mc"}`, "mc"},
		{Responses, "", `"prompt_cache_key":"","user":3,"metadata":"x"`, ""},
		// Chat and completions have no previous_response_id.
		{Chat, "", all, "pck"},
		{Chat, "", `"previous_response_id":"resp_1","safety_identifier":"safe","user":"u"`, "safe"},
		{Chat, "", `"user":"u","metadata":{"conversation_id":"mc"}`, "u"},
		{Completion, "", `"metadata":{"conversation_id":"mc"}`, "mc"},
	}
	for _, tt := range tests {
		body := `{"model":"m","input":"x","messages":[{"role":"user","content":"x"}],"prompt":"x",` + tt.members + `}`
		g, e := Parse(tt.ep, []byte(body), tt.header)
		if e != nil {
			t.Fatalf("%s: %v", body, e)
		}
		if g.Request.SessionKey != tt.want {
			t.Errorf("Endpoint %d, header %q, %s: session %q, want %q", tt.ep, tt.header, tt.members, g.Request.SessionKey, tt.want)
		}
	}
}
