package request

import (
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/router"
)

func chatPrompt(t *testing.T, body string) string {
	t.Helper()
	g, e := Parse(Chat, []byte(body), "")
	if e != nil {
		t.Fatalf("parse %s: %v", body, e)
	}
	return g.Request.Prompt
}

func TestRenderChat(t *testing.T) {
	tests := []struct {
		name     string
		messages string
		want     string
	}{
		{
			name:     "string content, every message in order",
			messages: `[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]`,
			want:     "system\nBe brief.\nuser\nHi\n",
		},
		{
			name:     "escapes are decoded",
			messages: `[{"role":"user","content":"a\"b\\c\nd\u00e9\ud83d\ude00\/"}]`,
			want:     "user\na\"b\\c\ndé😀/\n",
		},
		{
			name:     "text parts joined by newlines",
			messages: `[{"role":"user","content":[{"type":"text","text":"look"},{"type":"text","text":"here"}]}]`,
			want:     "user\nlook\nhere\n",
		},
		{
			name:     "name",
			messages: `[{"role":"user","name":"alice","content":"Hi"}]`,
			want:     "user name=alice\nHi\n",
		},
		{
			name: "tool calls and results count",
			messages: `[{"role":"assistant","content":null,"tool_calls":[ {"id":"call_1", "type":"function",
				"function":{"name":"add","arguments":"{\"a\": 1}"}} ]},
				{"role":"tool","tool_call_id":"call_1","content":"2"}]`,
			want: "assistant\n" +
				`[{"id":"call_1","type":"function","function":{"name":"add","arguments":"{\"a\": 1}"}}]` + "\n" +
				"tool tool_call_id=call_1\n2\n",
		},
		{
			name:     "content and tool calls",
			messages: `[{"role":"assistant","content":"Adding.","tool_calls":[{"id":"c"}]}]`,
			want:     "assistant\nAdding.\n[{\"id\":\"c\"}]\n",
		},
		{
			name:     "empty tool calls are nothing",
			messages: `[{"role":"assistant","content":"ok","tool_calls":[]}]`,
			want:     "assistant\nok\n",
		},
		{
			name:     "missing content",
			messages: `[{"role":"assistant"}]`,
			want:     "assistant\n\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := chatPrompt(t, `{"model":"m","messages":`+tt.messages+`}`)
			if got != tt.want {
				t.Errorf("Prompt = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestRenderChatIgnoresLayout(t *testing.T) {
	a := chatPrompt(t, `{"model":"m","temperature":0.5,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`)
	b := chatPrompt(t, "{\n  \"messages\" : [ { \"content\" : [ {\"text\":\"x\",\"type\":\"text\"} ] , \"role\":\"user\" } ],\n  \"model\":\"m\", \"stream\": true\n}")
	if a != b {
		t.Errorf("equal conversations rendered differently: %q and %q", a, b)
	}
}

func TestRenderChatImageParts(t *testing.T) {
	render := func(image string) string {
		return chatPrompt(t, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},`+image+`]}]}`)
	}
	p1 := render(`{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}`)
	p1spaced := render(`{ "type": "image_url", "image_url": { "url": "data:image/png;base64,AAAA" } }`)
	p2 := render(`{"type":"image_url","image_url":{"url":"data:image/png;base64,BBBB"}}`)
	if !regexp.MustCompile(`^user\nWhat is this\?\n<image_url [0-9a-f]+>\n$`).MatchString(p1) {
		t.Errorf("Prompt = %q, want the text and an image digest", p1)
	}
	if p1 != p1spaced {
		t.Errorf("the same image rendered differently: %q, %q", p1, p1spaced)
	}
	if p1 == p2 {
		t.Errorf("different images rendered equally: %q", p1)
	}
}

// Turn 2 of a conversation is turn 1 plus the reply plus the next question:
// its prompt must extend turn 1's, or the prefix index cannot match it.
func TestRenderChatTurnsExtend(t *testing.T) {
	turn1 := `[{"role":"system","content":"You are terse."},{"role":"user","content":"Name a prime."}]`
	turn2 := `[{"role":"system","content":"You are terse."},{"role":"user","content":"Name a prime."},` +
		`{"role":"assistant","content":"7"},{"role":"user","content":"Another?"}]`
	p1 := chatPrompt(t, `{"model":"m","messages":`+turn1+`}`)
	p2 := chatPrompt(t, `{"model":"m","messages":`+turn2+`}`)
	if !strings.HasPrefix(p2, p1) || len(p2) <= len(p1) {
		t.Errorf("turn 2 %q does not extend turn 1 %q", p2, p1)
	}
	if !strings.Contains(p1, "Name a prime.") {
		t.Errorf("turn 1 %q lacks the user message", p1)
	}
}

func TestRenderCompletionPrompt(t *testing.T) {
	tests := []struct {
		name, prompt, want string
	}{
		{"string", `"Once upon\na time"`, "Once upon\na time"},
		{"one string in an array", `["Once"]`, "Once"},
		{"token ids", `[128000, 9906, 1917]`, "128000 9906 1917"},
		{"a batch of strings: the first", `["a", "b"]`, "a"},
		{"a batch of token ids: the first", `[[1,2],[3]]`, "1 2"},
		{"mixed array as compact JSON", `[1, "a"]`, `[1,"a"]`},
		{"empty array", `[]`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, e := Parse(Completion, []byte(`{"model":"m","prompt":`+tt.prompt+`}`), "")
			if e != nil {
				t.Fatal(e)
			}
			if g.Request.Prompt != tt.want {
				t.Errorf("Prompt = %q, want %q", g.Request.Prompt, tt.want)
			}
		})
	}
}

func TestParseGenerationFacts(t *testing.T) {
	tests := []struct {
		name   string
		header string
		body   string
		want   Generation
	}{
		{
			name:   "session header wins",
			header: "hdr",
			body:   `{"model":"m","messages":[{"role":"user","content":"x"}],"prompt_cache_key":"pck","user":"u"}`,
			want:   Generation{Request: router.Request{SessionKey: "hdr"}},
		},
		{
			name: "then prompt_cache_key",
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"prompt_cache_key":"pck","user":"u"}`,
			want: Generation{Request: router.Request{SessionKey: "pck"}},
		},
		{
			name: "then user",
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"user":"u"}`,
			want: Generation{Request: router.Request{SessionKey: "u"}},
		},
		{
			name: "no session",
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"user":null}`,
			want: Generation{},
		},
		{
			name: "max_completion_tokens over max_tokens",
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":5,"max_completion_tokens":7}`,
			want: Generation{Request: router.Request{MaxTokens: 7}},
		},
		{
			name: "max_tokens",
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":5}`,
			want: Generation{Request: router.Request{MaxTokens: 5}},
		},
		{
			name: "odd max_tokens is no estimate",
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":"5"}`,
			want: Generation{},
		},
		{
			name: "stream without usage",
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`,
			want: Generation{Stream: true},
		},
		{
			name: "stream with usage",
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}`,
			want: Generation{Stream: true, IncludeUsage: true},
		},
		{
			name: "last duplicate key wins, as in the backend",
			body: `{"model":"other","messages":[{"role":"user","content":"x"}],"model":"m"}`,
			want: Generation{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, e := Parse(Chat, []byte(tt.body), tt.header)
			if e != nil {
				t.Fatal(e)
			}
			tt.want.Request.Model = "m"
			tt.want.Request.Prompt = "user\nx\n"
			if !reflect.DeepEqual(*g, tt.want) {
				t.Errorf("got %+v, want %+v", *g, tt.want)
			}
		})
	}
}

func TestParseGenerationErrors(t *testing.T) {
	tests := []struct {
		name      string
		ep        Endpoint
		body      string
		wantParam string
	}{
		{"empty", Chat, ``, ""},
		{"malformed", Chat, `{"model":`, ""},
		{"not an object", Chat, `["model"]`, ""},
		{"no model", Chat, `{"messages":[{"role":"user","content":"x"}]}`, "model"},
		{"model not a string", Chat, `{"model":7,"messages":[]}`, "model"},
		{"empty model", Chat, `{"model":"","messages":[]}`, "model"},
		{"no messages", Chat, `{"model":"m"}`, "messages"},
		{"messages not an array", Chat, `{"model":"m","messages":"hi"}`, "messages"},
		{"no message", Chat, `{"model":"m","messages":[]}`, "messages"},
		{"message not an object", Chat, `{"model":"m","messages":["hi"]}`, "messages[0]"},
		{"message without role", Chat, `{"model":"m","messages":[{"content":"hi"}]}`, "messages[0].role"},
		{"no prompt", Completion, `{"model":"m"}`, "prompt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, e := Parse(tt.ep, []byte(tt.body), "")
			if e == nil {
				t.Fatal("no error")
			}
			if e.Status != 400 || e.Type != openai.TypeInvalidRequest || e.Param != tt.wantParam {
				t.Errorf("error %+v, want 400 %s about %q", e, openai.TypeInvalidRequest, tt.wantParam)
			}
		})
	}
}

func TestWithIncludeUsage(t *testing.T) {
	tests := []struct {
		name, body, want string
		wantOK           bool
	}{
		{"absent", `{"model":"m","stream":true}`,
			`{"stream_options":{"include_usage":true},"model":"m","stream":true}`, true},
		{"absent, spaced", " {\n \"stream\" : true }",
			" {\"stream_options\":{\"include_usage\":true},\n \"stream\" : true }", true},
		{"null", `{"stream":true,"stream_options":null}`,
			`{"stream":true,"stream_options":{"include_usage":true}}`, true},
		{"empty object", `{"stream_options": { },"stream":true}`,
			`{"stream_options": {"include_usage":true },"stream":true}`, true},
		{"false", `{"stream_options":{"include_usage":false,"continuous_usage_stats":false},"stream":true}`,
			`{"stream_options":{"include_usage":true,"continuous_usage_stats":false},"stream":true}`, true},
		{"other options", `{"stream":true,"stream_options":{"continuous_usage_stats":true}}`,
			`{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, true},
		{"not an object: left to the backend", `{"stream":true,"stream_options":"yes"}`,
			`{"stream":true,"stream_options":"yes"}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := WithIncludeUsage([]byte(tt.body))
			if string(got) != tt.want || ok != tt.wantOK {
				t.Errorf("got %s, %v; want %s, %v", got, ok, tt.want, tt.wantOK)
			}
			if !json.Valid(got) {
				t.Errorf("result %s is not JSON", got)
			}
			if !ok {
				return
			}
			var before, after map[string]any
			_ = json.Unmarshal([]byte(tt.body), &before)
			_ = json.Unmarshal(got, &after)
			so, _ := after["stream_options"].(map[string]any)
			if so["include_usage"] != true {
				t.Errorf("stream_options = %v, want include_usage true", after["stream_options"])
			}
			delete(before, "stream_options")
			delete(after, "stream_options")
			if !reflect.DeepEqual(before, after) {
				t.Errorf("other jsonscan.Members changed: %v -> %v", before, after)
			}
		})
	}
}
