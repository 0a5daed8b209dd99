package epp

import (
	"testing"
)

func TestWatcher(t *testing.T) {
	tests := []struct {
		name                       string
		sse                        bool
		chunks                     []string
		wantTokens                 int
		wantContentAt              int // index of the chunk that first reports content; -1: none
		prompt, cached, completion int
	}{
		{"stream split mid-line", true, []string{
			"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\ndata: {\"choi",
			"ces\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n",
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n",
		}, 1, 1, 10, 8, 1},
		{"completion text, usage without details", true, []string{
			"data: {\"choices\":[{\"text\":\"a\"}]}\n\n", "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n",
		}, 1, 0, 3, -1, 1},
		{"tool call counts as content", true, []string{
			"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}\n\n",
		}, 1, 0, -1, -1, -1},
		{"not streamed", false, []string{
			`{"choices":[{"message":{"content":"hi"}}],`, `"usage":{"prompt_tokens":5,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}`,
		}, 0, 0, 5, 4, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWatcher(tt.sse)
			at := -1
			for i, c := range tt.chunks {
				if w.feed([]byte(c)) && at < 0 {
					at = i
				}
			}
			w.end()
			if at != tt.wantContentAt || w.tokens != tt.wantTokens {
				t.Errorf("content first at chunk %d, %d content chunks; want %d, %d", at, w.tokens, tt.wantContentAt, tt.wantTokens)
			}
			if w.prompt != tt.prompt || w.cached != tt.cached || w.completion != tt.completion {
				t.Errorf("usage %d/%d/%d, want %d/%d/%d", w.prompt, w.cached, w.completion, tt.prompt, tt.cached, tt.completion)
			}
		})
	}
}
