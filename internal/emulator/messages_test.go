package emulator

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// messageJSON is a client's view of a Messages API message.
type messageJSON struct {
	ID         string `json:"id"`
	Type       string `json:"type"`
	Role       string `json:"role"`
	StopReason string `json:"stop_reason"`
	Content    []struct {
		Type, Text string
	} `json:"content"`
	Usage struct {
		InputTokens          int `json:"input_tokens"`
		CacheReadInputTokens int `json:"cache_read_input_tokens"`
		OutputTokens         int `json:"output_tokens"`
	} `json:"usage"`
}

// TestMessagesAPI: a message answers with text, a stop reason and usage in
// Anthropic's terms (the second turn reads the first from the cache); a
// stream is Anthropic's events, each with its event line, the usage in
// message_start and message_delta; count_tokens counts the prompt.
func TestMessagesAPI(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	system := strings.Repeat("You answer questions about caches. ", 30)
	turn1 := map[string]any{"model": testModel, "max_tokens": 8, "system": []map[string]any{{"type": "text", "text": system}},
		"messages": []map[string]any{{"role": "user", "content": "What is a KV cache?"}}}
	resp, body := post(t, url+"/v1/messages", turn1)
	var m1 messageJSON
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &m1) != nil || !strings.HasPrefix(m1.ID, "msg_") || m1.Type != "message" ||
		m1.Role != "assistant" || len(m1.Content) != 1 || m1.Content[0].Type != "text" || m1.Content[0].Text == "" {
		t.Fatalf("turn 1: %d %s", resp.StatusCode, body)
	}
	if m1.StopReason != "end_turn" && m1.StopReason != "max_tokens" || m1.Usage.OutputTokens < 1 || m1.Usage.InputTokens < 200 {
		t.Errorf("turn 1: %s", body)
	}

	turn2 := map[string]any{"model": testModel, "max_tokens": 8, "stream": true, "system": system, "metadata": map[string]any{"user_id": "u"},
		"messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "text", "text": "What is a KV cache?"}}},
			{"role": "assistant", "content": m1.Content[0].Text}, {"role": "user", "content": "And prefix caching?"}}}
	data, _ := json.Marshal(turn2)
	res, err := http.Post(url+"/v1/messages", "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); res.StatusCode != http.StatusOK || !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("turn 2: %d %q", res.StatusCode, ct)
	}
	var types []string
	var text strings.Builder
	var start, delta struct {
		Message struct {
			Usage struct {
				InputTokens          int `json:"input_tokens"`
				CacheReadInputTokens int `json:"cache_read_input_tokens"`
			} `json:"usage"`
		} `json:"message"`
		Delta struct {
			StopReason string `json:"stop_reason"`
		} `json:"delta"`
		Usage struct {
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	sc := bufio.NewScanner(res.Body)
	event := ""
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "event: "); ok {
			event = name
			continue
		}
		payload, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type  string `json:"type"`
			Delta struct {
				Text string `json:"text"`
			} `json:"delta"`
		}
		if err := json.Unmarshal([]byte(payload), &ev); err != nil || ev.Type != event {
			t.Fatalf("event %q data %s (%v)", event, payload, err)
		}
		types = append(types, ev.Type)
		switch ev.Type {
		case "message_start":
			_ = json.Unmarshal([]byte(payload), &start)
		case "content_block_delta":
			text.WriteString(ev.Delta.Text)
		case "message_delta":
			_ = json.Unmarshal([]byte(payload), &delta)
		}
	}
	got := strings.Join(types, " ")
	if !strings.HasPrefix(got, "message_start content_block_start content_block_delta") ||
		!strings.HasSuffix(got, "content_block_delta content_block_stop message_delta message_stop") {
		t.Errorf("events %s", got)
	}
	u := start.Message.Usage
	if u.CacheReadInputTokens < m1.Usage.InputTokens/2 || u.InputTokens < 1 {
		t.Errorf("turn 2 usage %+v: want turn 1's prompt read from the cache", u)
	}
	if delta.Usage.OutputTokens < 1 || delta.Delta.StopReason == "" || text.Len() == 0 {
		t.Errorf("message_delta %+v, text %q", delta, text.String())
	}

	resp, body = post(t, url+"/v1/messages/count_tokens", turn1)
	var count struct {
		InputTokens int `json:"input_tokens"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &count) != nil || count.InputTokens != m1.Usage.InputTokens+m1.Usage.CacheReadInputTokens {
		t.Errorf("count_tokens %d %s, want %d", resp.StatusCode, body, m1.Usage.InputTokens+m1.Usage.CacheReadInputTokens)
	}
}

// TestMessagesErrors: errors on the Messages API are in Anthropic's shape.
func TestMessagesErrors(t *testing.T) {
	s, url := startServer(t, Config{}, nil)
	msgs := []map[string]any{{"role": "user", "content": "hi"}}
	tests := []struct {
		name   string
		body   any
		faults Faults
		status int
		typ    string
	}{
		{"no max_tokens", map[string]any{"model": testModel, "messages": msgs}, Faults{}, 400, "invalid_request_error"},
		{"unknown model", map[string]any{"model": "other", "max_tokens": 4, "messages": msgs}, Faults{}, 404, "not_found_error"},
		{"no messages", map[string]any{"model": testModel, "max_tokens": 4}, Faults{}, 400, "invalid_request_error"},
		{"bad JSON", `{"model":`, Faults{}, 400, "invalid_request_error"},
		{"injected 500", map[string]any{"model": testModel, "max_tokens": 4, "messages": msgs}, Faults{Rate500: 1}, 500, "api_error"},
		{"injected 429", map[string]any{"model": testModel, "max_tokens": 4, "messages": msgs}, Faults{Rate429: 1}, 429, "rate_limit_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := s.SetFaults(tt.faults); err != nil {
				t.Fatal(err)
			}
			resp, body := post(t, url+"/v1/messages", tt.body)
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type, Message string
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != tt.status || e.Type != "error" ||
				e.Error.Type != tt.typ || e.Error.Message == "" {
				t.Errorf("%d %s, want %d %s in Anthropic's shape", resp.StatusCode, body, tt.status, tt.typ)
			}
		})
	}
}
