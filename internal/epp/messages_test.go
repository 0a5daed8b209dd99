package epp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

func TestWatcherMessages(t *testing.T) {
	tests := []struct {
		name                       string
		sse                        bool
		chunks                     []string
		wantTokens, wantContentAt  int
		prompt, cached, completion int
	}{
		{"stream, Anthropic's usage", true, []string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":4,\"cache_read_input_tokens\":32,\"cache_creation_input_tokens\":0,\"output_tokens\":0}}}\n\n" +
				"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\n",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3}}\n\n" +
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
		}, 1, 1, 36, 32, 3},
		{"stream, vLLM's usage", true, []string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"chatcmpl-1\",\"usage\":{\"input_tokens\":20,\"output_tokens\":0}}}\n\n",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":20,\"output_tokens\":2}}\n\n",
		}, 1, 1, 20, -1, 2},
		{"not streamed", false, []string{
			`{"id":"msg_2","type":"message","content":[{"type":"text","text":"Hi"}],`, `"usage":{"input_tokens":5,"cache_read_input_tokens":16,"output_tokens":2}}`,
		}, 0, 0, 21, 16, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWatcher(tt.sse)
			w.messages = true
			at := -1
			for i, c := range tt.chunks {
				if w.feed([]byte(c)) && at < 0 {
					at = i
				}
			}
			w.end()
			if w.tokens != tt.wantTokens || at != tt.wantContentAt || w.prompt != tt.prompt || w.cached != tt.cached || w.completion != tt.completion {
				t.Errorf("tokens %d, content at %d, usage %d/%d/%d; want %d, %d, %d/%d/%d", w.tokens, at, w.prompt, w.cached, w.completion,
					tt.wantTokens, tt.wantContentAt, tt.prompt, tt.cached, tt.completion)
			}
		})
	}
}

// messagesReply reads a Messages API answer, streamed or not: its text and
// the prompt and cached tokens the backend reported.
func messagesReply(t *testing.T, body []byte, stream bool) (text string, prompt, cached int) {
	t.Helper()
	w := newWatcher(stream)
	w.messages = true
	w.feed(body)
	w.end()
	if !stream {
		var m struct {
			Content []struct{ Text string } `json:"content"`
		}
		if json.Unmarshal(body, &m) != nil || len(m.Content) != 1 {
			t.Fatalf("message %s", body)
		}
		return m.Content[0].Text, w.prompt, w.cached
	}
	var sb strings.Builder
	for line := range bytes.SplitSeq(body, []byte("\n")) {
		if data, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
			var ev struct {
				Type  string `json:"type"`
				Delta struct{ Text string }
			}
			if json.Unmarshal(data, &ev) == nil && ev.Type == "content_block_delta" {
				sb.WriteString(ev.Delta.Text)
			}
		}
	}
	return sb.String(), w.prompt, w.cached
}

// TestMessagesThroughPicker: Messages API conversations through the picker
// to emulators, streamed and not: every turn after the first goes to the
// endpoint of the turn before and finds its prompt cached there, the hit
// rate as the same conversations over chat; the picker's refusals on the
// path are in Anthropic's shape.
func TestMessagesThroughPicker(t *testing.T) {
	ctx := t.Context()
	rate := map[string]float64{}
	for _, api := range []string{"chat", "messages"} {
		bs := emulators(t, ctx, 4)
		_, env := startPicker(t, ctx, bs, "kvroute", Options{})
		var prompt, cached int
		for conv := range 6 {
			system := fmt.Sprintf("Conversation %d. ", conv) + strings.Repeat("Answer about prefix caches and routers. ", 25)
			var msgs []message
			home := ""
			for turn := range 4 {
				msgs = append(msgs, message{"user", fmt.Sprintf("conversation %d, turn %d: %s", conv, turn, strings.Repeat("go on. ", 20))})
				stream := (conv+turn)%2 == 0
				path, body := "/v1/chat/completions", chatBody(model(bs), append([]message{{"system", system}}, msgs...), 8)
				if api == "messages" {
					path = "/v1/messages"
					body, _ = json.Marshal(map[string]any{"model": model(bs), "max_tokens": 8, "system": system, "messages": msgs,
						"stream": stream, "metadata": map[string]any{"user_id": fmt.Sprint("u", conv)}})
				}
				res, err := env.do(ctx, path, nil, body)
				if err != nil {
					t.Fatal(err)
				}
				if res.status != http.StatusOK {
					t.Fatalf("%s conversation %d turn %d: status %d: %s", api, conv, turn, res.status, res.body)
				}
				var text string
				var p, c int
				if api == "messages" {
					text, p, c = messagesReply(t, res.body, stream)
				} else {
					text, p, c = reply(res.body)
				}
				if turn > 0 && (res.list[0] != home || c < p/2) {
					t.Errorf("%s conversation %d turn %d: on %s with %d of %d tokens cached, the turn before on %s", api, conv, turn, res.list[0], c, p, home)
				}
				home = res.list[0]
				msgs = append(msgs, message{"assistant", text})
				prompt, cached = prompt+p, cached+c
			}
		}
		rate[api] = float64(cached) / float64(prompt)
		t.Logf("%-8s through the picker: %d of %d prompt tokens cached, hit rate %.1f %%", api, cached, prompt, 100*rate[api])
	}
	if d := rate["messages"] - rate["chat"]; d > 0.01 || d < -0.01 {
		t.Errorf("hit rate over messages %.1f %%, over chat %.1f %%: want within a point", 100*rate["messages"], 100*rate["chat"])
	}

	bs := emulators(t, ctx, 1)
	_, env := startPicker(t, ctx, bs, "kvroute", Options{})
	for _, tt := range []struct {
		name, body string
		status     int
		typ        string
	}{
		{"no max_tokens", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error"},
		{"no endpoint serves the model", `{"model":"nobody","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, 503, "overloaded_error"},
	} {
		res, err := env.do(ctx, "/v1/messages", nil, []byte(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Type  string `json:"type"`
			Error struct{ Type, Message string }
		}
		if err := json.Unmarshal(res.body, &e); err != nil || !res.immediate || res.status != tt.status || e.Type != "error" || e.Error.Type != tt.typ {
			t.Errorf("%s: %d %s (%v), want an immediate %d %s", tt.name, res.status, res.body, err, tt.status, tt.typ)
		}
	}
}
