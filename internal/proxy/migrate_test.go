package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/sse"
)

func TestContinuable(t *testing.T) {
	tests := []struct {
		name string
		ep   request.Endpoint
		body string
		want bool
	}{
		{"chat", request.Chat, `{"messages":[],"n":1,"logprobs":false,"seed":3}`, true},
		{"n", request.Chat, `{"messages":[],"n":2}`, false},
		{"logprobs", request.Chat, `{"messages":[],"logprobs":true}`, false},
		{"top_logprobs", request.Chat, `{"messages":[],"top_logprobs":2}`, false},
		{"completion", request.Completion, `{"prompt":"Hi","logprobs":null}`, true},
		{"one prompt", request.Completion, `{"prompt":["Hi"]}`, true},
		{"token ids", request.Completion, `{"prompt":[1,2,3]}`, false},
		{"completion logprobs", request.Completion, `{"prompt":"Hi","logprobs":1}`, false},
		{"echo", request.Completion, `{"prompt":"Hi","echo":true}`, false},
		{"best_of", request.Completion, `{"prompt":"Hi","best_of":3}`, false},
		{"responses", request.Responses, `{"input":"Hi"}`, false},
		{"response_format text", request.Chat, `{"messages":[],"response_format":{"type":"text"}}`, true},
		{"json_schema", request.Chat, `{"messages":[],"response_format":{"type":"json_schema","json_schema":{}}}`, false},
		{"guided_regex", request.Completion, `{"prompt":"Hi","guided_regex":"a+"}`, false},
		{"llama.cpp grammar", request.Completion, `{"prompt":"Hi","grammar":"root ::= \"a\""}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := continuable(tt.ep, []byte(tt.body)); got != tt.want {
				t.Errorf("continuable = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestContinuation(t *testing.T) {
	rec := &sse.Record{Text: []byte("The \"sea\""), Chunks: 3}
	tests := []struct {
		name   string
		ep     request.Endpoint
		body   string
		want   map[string]string // member: its JSON
		wantOK bool
	}{
		{"chat", request.Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":10,"seed":7,"temperature":0.5,"stream":true}`,
			map[string]string{
				"messages":               `[{"role":"user","content":"x"},{"role":"assistant","content":"The \"sea\""}]`,
				"continue_final_message": "true", "add_generation_prompt": "false",
				"max_tokens": "7", "seed": "7", "temperature": "0.5", "stream": "true",
			}, true},
		{"chat, max_completion_tokens", request.Chat, `{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":4}`,
			map[string]string{"max_completion_tokens": "1"}, true},
		{"chat, no limit", request.Chat, `{"messages":[{"role":"user","content":"x"}]}`,
			map[string]string{"continue_final_message": "true"}, true},
		{"nothing left", request.Chat, `{"messages":[{"role":"user","content":"x"}],"max_tokens":3}`, nil, true},
		{"completion", request.Completion, `{"prompt":"Once.\n","max_tokens":5}`,
			map[string]string{"prompt": `"Once.\nThe \"sea\""`, "max_tokens": "2"}, true},
		{"completion, one prompt", request.Completion, `{"prompt":["Once.\n"]}`,
			map[string]string{"prompt": `"Once.\nThe \"sea\""`}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, spent, ok := continuation(tt.ep, []byte(tt.body), rec)
			if ok != tt.wantOK || spent != (tt.want == nil) {
				t.Fatalf("ok %v, spent %v; want %v, %v", ok, spent, tt.wantOK, tt.want == nil)
			}
			var got map[string]json.RawMessage
			if ok && !spent {
				if err := json.Unmarshal(out, &got); err != nil {
					t.Fatal(err)
				}
			}
			for k, v := range tt.want {
				if string(got[k]) != v {
					t.Errorf("%s = %s, want %s", k, got[k], v)
				}
			}
		})
	}
}

func TestSpliceRewritesEvents(t *testing.T) {
	rec := &sse.Record{ID: []byte(`"chatcmpl-1"`), Created: []byte("100"), Model: []byte(`"m"`), Chunks: 2}
	var out strings.Builder
	s := &splice{now: func() time.Time { return time.Unix(5, 0) }}
	s.start(writerTo{&out}, rec)
	events := `data: {"id":"chatcmpl-2","object":"chat.completion.chunk","created":200,"model":"m2","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"chatcmpl-2","object":"chat.completion.chunk","created":200,"model":"m2","choices":[{"index":0,"delta":{"content":" sea"},"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"chatcmpl-2","created":200,"model":"m2","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n" +
		`data: {"id":"chatcmpl-2","created":200,"model":"m2","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":11}}}` + "\n\n" +
		"data: [DONE]\n\n"
	// In parts, as the copier writes an edited event.
	for i := 0; i < len(events); i += 37 {
		if _, err := s.Write([]byte(events[i:min(i+37, len(events))])); err != nil {
			t.Fatal(err)
		}
	}
	want := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":100,"model":"m","choices":[{"index":0,"delta":{"content":" sea"},"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"chatcmpl-1","created":100,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n" +
		`data: {"id":"chatcmpl-1","created":100,"model":"m","choices":[],"usage":{"prompt_tokens":10,"total_tokens":15,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":10}}}` + "\n\n" +
		"data: [DONE]\n\n"
	if out.String() != want {
		t.Errorf("spliced\n%s\nwant\n%s", out.String(), want)
	}
	if s.firstAt.IsZero() {
		t.Error("the continuation's first token was not noted")
	}
}

// writerTo is a ResponseWriter onto a strings.Builder.
type writerTo struct{ b *strings.Builder }

func (w writerTo) Header() http.Header         { return http.Header{} }
func (w writerTo) WriteHeader(int)             {}
func (w writerTo) Write(p []byte) (int, error) { return w.b.Write(p) }

// A backend's error event mid-stream: the stream continues on the other
// backend, asked to continue the text so far; a backend that refuses to
// continue ends the stream with the first one's error event, and is not
// asked again.
func TestMigrationOnErrorEvent(t *testing.T) {
	chunk := func(id, content string) string {
		return `data: {"id":"` + id + `","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"` + content + `"},"finish_reason":null}]}` + "\n\n"
	}
	failing := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, chunk("a", "Hi")+chunk("a", " there")+
			`data: {"error":{"message":"engine died","type":"server_error","code":500}}`+"\n\ndata: [DONE]\n\n")
	}))
	var mu sync.Mutex
	var asked []string
	refuse := false
	other := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		asked = append(asked, string(body))
		no := refuse
		mu.Unlock()
		if no {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"no","type":"invalid_request_error"}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"id":"b","created":2,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`+"\n\n"+
			chunk("b", " world")+
			`data: {"id":"b","created":2,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
	}))
	b0, b1 := testBackend(t, 0, "b0", failing.URL, "m"), testBackend(t, 1, "b1", other.URL, "m")
	_, px := newTestProxy(t, newFakeFleet(b0, b1), newFirstPolicy(), quick)

	_, body := post(t, px.URL, "/v1/chat/completions", streamBody)
	want := chunk("a", " world")
	if !strings.HasPrefix(body, chunk("a", "Hi")+chunk("a", " there")) || !strings.Contains(body, want) ||
		strings.Contains(body, `"error"`) || strings.Count(body, "[DONE]") != 1 || strings.Contains(body, `"id":"b"`) {
		t.Errorf("client got\n%s\nwant Hi there, then the continuation as %s", body, want)
	}
	var cont struct {
		Messages []struct{ Role, Content string }
		Continue bool `json:"continue_final_message"`
		AddGen   bool `json:"add_generation_prompt"`
	}
	if err := json.Unmarshal([]byte(asked[0]), &cont); err != nil {
		t.Fatal(err)
	}
	if n := len(cont.Messages); n != 2 || cont.Messages[1].Role != "assistant" || cont.Messages[1].Content != "Hi there" ||
		!cont.Continue || cont.AddGen {
		t.Errorf("the continuation asked %s", asked[0])
	}

	mu.Lock()
	refuse = true
	mu.Unlock()
	_, body = post(t, px.URL, "/v1/chat/completions", streamBody)
	if !strings.Contains(body, "engine died") || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Errorf("with no backend to continue, the client got\n%s\nwant the backend's error event", body)
	}
	_, _ = post(t, px.URL, "/v1/chat/completions", streamBody)
	if len(asked) != 2 {
		t.Errorf("the backend that refused to continue was asked %d times, want once more", len(asked)-1)
	}
}
