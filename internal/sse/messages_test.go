package sse

import (
	"net/http/httptest"
	"strings"
	"testing"
)

func TestParseMessagesUsage(t *testing.T) {
	tests := []struct {
		name, v string
		want    Usage
	}{
		{"Anthropic's: input excludes the cache", `{"input_tokens":5,"cache_read_input_tokens":96,"cache_creation_input_tokens":3,"output_tokens":7}`, Usage{104, 96, 7}},
		{"vLLM's: the whole prompt, no cache members", `{"input_tokens":40,"output_tokens":2}`, Usage{40, -1, 2}},
		{"nulls are not said", `{"input_tokens":40,"cache_read_input_tokens":null,"output_tokens":2}`, Usage{40, -1, 2}},
		{"output only", `{"output_tokens":15}`, Usage{-1, -1, 15}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if u, ok := ParseMessagesUsage([]byte(tt.v)); !ok || u != tt.want {
				t.Errorf("ParseMessagesUsage = %+v %v, want %+v", u, ok, tt.want)
			}
		})
	}
	if _, ok := ParseMessagesUsage([]byte(`null`)); ok {
		t.Error("null parsed as usage")
	}
}

var messagesEvents = []string{
	"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":4,\"cache_read_input_tokens\":32,\"cache_creation_input_tokens\":0,\"output_tokens\":1}}}\n\n",
	"event: ping\ndata: {\"type\":\"ping\"}\n\n",
	"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" there\"}}\n\n",
	"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
	"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":2}}\n\n",
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
}

// TestScannerMessagesEvents: the content_block_deltas carry the content,
// message_start the input and cached tokens, message_delta the output;
// every event goes through whole, its event line with it.
func TestScannerMessagesEvents(t *testing.T) {
	var s Scanner
	first := 0
	for i, ev := range messagesEvents {
		if drop, from, to := s.inspect([]byte(ev)); drop || from != to {
			t.Errorf("inspect(%q) = %v %d %d, want it forwarded whole", ev, drop, from, to)
		}
		if s.Tokens > 0 && first == 0 {
			first = i
		}
	}
	if first != 3 {
		t.Errorf("first content at event %d, want 3 (the first content_block_delta)", first)
	}
	if s.Tokens != 2 || !s.SawUsage || s.Usage != (Usage{Prompt: 36, Cached: 32, Completion: 2}) {
		t.Errorf("tokens %d usage %+v (%v), want 2 tokens, usage 36/32/2", s.Tokens, s.Usage, s.SawUsage)
	}

	rec := httptest.NewRecorder()
	var sc Scanner
	in := strings.Join(messagesEvents, "")
	if rerr, werr := Copy(rec, &chunkReader{b: []byte(in), n: 7}, &sc, nil); rerr != nil || werr != nil {
		t.Fatal(rerr, werr)
	}
	if rec.Body.String() != in || sc.Usage != s.Usage {
		t.Errorf("copied %q, usage %+v; want the stream as it came, usage %+v", rec.Body, sc.Usage, s.Usage)
	}
}
