package request

import (
	"net/http"
	"strings"
	"testing"
)

func messagesPrompt(t *testing.T, body string) string {
	t.Helper()
	g, e := Parse(Messages, []byte(body), "")
	if e != nil {
		t.Fatalf("parse %s: %v", body, e)
	}
	return g.Request.Prompt
}

func TestRenderMessages(t *testing.T) {
	tests := []struct {
		name string
		body string // members after "model" and "max_tokens"
		want string
	}{
		{
			name: "string system and contents",
			body: `"system":"Be brief.","messages":[{"role":"user","content":"Hi"}]`,
			want: "system\nBe brief.\nuser\nHi\n",
		},
		{
			name: "system blocks joined, the billing header left out, cache_control not read",
			body: `"system":[{"type":"text","text":"x-anthropic-billing-header: cc=1a2b"},{"type":"text","text":"A"},
				{"type":"text","text":"B","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"Hi"}]`,
			want: "system\nA\nB\nuser\nHi\n",
		},
		{
			name: "tools after the system prompt",
			body: `"system":"S","tools":[{"name":"get","description":"Get it.","input_schema":{"type":"object", "properties":{}},"cache_control":{"type":"ephemeral"}},
				{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"Hi"}]`,
			want: "system\nS\ntools\nget\nGet it.\n" + `{"type":"object","properties":{}}` + "\n" +
				`{"type":"web_search_20250305","name":"web_search"}` + "\nuser\nHi\n",
		},
		{
			name: "blocks: text, thinking, tool_use, tool_result",
			body: `"messages":[{"role":"user","content":[{"type":"text","text":"add 1 and 2"}]},
				{"role":"assistant","content":[{"type":"thinking","thinking":"use the tool","signature":"s"},
					{"type":"tool_use","id":"t1","name":"add","input":{"a": 1, "b": 2}}]},
				{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"3"}],"cache_control":{"type":"ephemeral"}}]}]`,
			want: "user\nadd 1 and 2\nassistant\nuse the tool\ntool_use add id=t1\n" + `{"a":1,"b":2}` +
				"\nuser\ntool_result tool_use_id=t1\n3\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := messagesPrompt(t, `{"model":"m","max_tokens":8,`+tt.body+`}`); got != tt.want {
				t.Errorf("Prompt = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestMessagesImagesDigested: an image is a short digest, different images
// give different prompts.
func TestMessagesImagesDigested(t *testing.T) {
	img := func(data string) string {
		return `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` +
			data + `"}},{"type":"text","text":"what is it?"}]}]}`
	}
	a, b := messagesPrompt(t, img(strings.Repeat("A", 4096))), messagesPrompt(t, img(strings.Repeat("B", 4096)))
	if a == b || len(a) > 64 || !strings.HasPrefix(a, "user\n<image ") {
		t.Errorf("image prompts %q and %q: want distinct short digests", a, b)
	}
}

// TestMessagesTurnsArePrefixes: turn N+1 renders turn N's prompt and reply
// as its prefix, though the client moved its cache_control mark to the
// newest block; and a plain conversation renders as it does over chat.
func TestMessagesTurnsArePrefixes(t *testing.T) {
	turn1 := messagesPrompt(t, `{"model":"m","max_tokens":8,"system":[{"type":"text","text":"S"}],
		"messages":[{"role":"user","content":[{"type":"text","text":"Hi","cache_control":{"type":"ephemeral"}}]}]}`)
	turn2 := messagesPrompt(t, `{"model":"m","max_tokens":8,"system":[{"type":"text","text":"S"}],
		"messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]},
		{"role":"assistant","content":[{"type":"text","text":"Hello"}]},
		{"role":"user","content":[{"type":"text","text":"More","cache_control":{"type":"ephemeral"}}]}]}`)
	if !strings.HasPrefix(turn2, turn1+"assistant\nHello\n") {
		t.Errorf("turn 2 %q does not extend turn 1 %q and its reply", turn2, turn1)
	}
	chat := chatPrompt(t, `{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"Hi"},
		{"role":"assistant","content":"Hello"},{"role":"user","content":"More"}]}`)
	if turn2 != chat {
		t.Errorf("messages prompt %q, chat prompt %q: want equal", turn2, chat)
	}
}

func TestMessagesFacts(t *testing.T) {
	g, e := Parse(Messages, []byte(`{"model":"claude","max_tokens":700,"stream":true,"metadata":{"user_id":"u-1"},
		"messages":[{"role":"user","content":"x"}]}`), "")
	if e != nil {
		t.Fatal(e)
	}
	if g.Request.Model != "claude" || g.Request.MaxTokens != 700 || !g.Stream || g.Request.SessionKey != "u-1" {
		t.Errorf("facts = %+v, stream %v", g.Request, g.Stream)
	}
	g, e = ParseGeneration("/v1/messages", []byte(`{"model":"m","max_tokens":1,"metadata":{"user_id":"u-1"},"messages":[{"role":"user","content":"x"}]}`), "s-9")
	if e != nil {
		t.Fatal(e)
	}
	if g.Request.SessionKey != "s-9" || g.Stream {
		t.Errorf("header session: key %q stream %v, want s-9 and false", g.Request.SessionKey, g.Stream)
	}
}

func TestMessagesErrors(t *testing.T) {
	tests := []struct {
		name, body, param string
	}{
		{"not JSON", `{"model":`, ""},
		{"no model", `{"max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, "model"},
		{"no max_tokens", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{"zero max_tokens", `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{"fractional max_tokens", `{"model":"m","max_tokens":1.5,"messages":[{"role":"user","content":"x"}]}`, "max_tokens"},
		{"no messages", `{"model":"m","max_tokens":1}`, "messages"},
		{"empty messages", `{"model":"m","max_tokens":1,"messages":[]}`, "messages"},
		{"message not an object", `{"model":"m","max_tokens":1,"messages":["x"]}`, "messages[0]"},
		{"no role", `{"model":"m","max_tokens":1,"messages":[{"content":"x"}]}`, "messages[0].role"},
		{"no content", `{"model":"m","max_tokens":1,"messages":[{"role":"user"}]}`, "messages[0].content"},
		{"bad system", `{"model":"m","max_tokens":1,"system":3,"messages":[{"role":"user","content":"x"}]}`, "system"},
		{"bad tools", `{"model":"m","max_tokens":1,"tools":{},"messages":[{"role":"user","content":"x"}]}`, "tools"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, e := Parse(Messages, []byte(tt.body), "")
			if e == nil {
				t.Fatal("no error")
			}
			if e.Status != http.StatusBadRequest || e.Param != tt.param {
				t.Errorf("error %d param %q (%s), want 400 param %q", e.Status, e.Param, e.Message, tt.param)
			}
		})
	}
}
