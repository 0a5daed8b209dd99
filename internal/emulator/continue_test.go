package emulator

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/tokenizer"
)

// TestContinueFinalMessage checks that continuing any prefix of a reply, as
// vLLM's chat API continues an open final assistant message, yields exactly
// the rest of the uninterrupted reply, with the same finish reason, and
// counts the prefix as prompt.
func TestContinueFinalMessage(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	user := map[string]any{"role": "user", "content": "Tell me about the sea."}
	for _, limited := range []bool{true, false} {
		body := map[string]any{"model": testModel, "messages": []any{user}}
		if limited {
			body["max_tokens"] = 40
		}
		whole, _ := complete(t, url+"/v1/chat/completions", body)
		text := whole.Choices[0].Message.Content
		pieces := splitPieces(text)
		for _, k := range []int{1, 2, len(pieces) / 2, len(pieces) - 1} {
			partial := strings.Join(pieces[:k], "")
			cont := map[string]any{
				"model":                  testModel,
				"messages":               []any{user, map[string]any{"role": "assistant", "content": partial}},
				"continue_final_message": true, "add_generation_prompt": false,
			}
			if limited {
				cont["max_tokens"] = 40 - k
			}
			r, _ := complete(t, url+"/v1/chat/completions", cont)
			if got := partial + r.Choices[0].Message.Content; got != text {
				t.Errorf("limited %v, k %d: continued text\n%q\nwant\n%q", limited, k, got, text)
			}
			if *r.Choices[0].FinishReason != *whole.Choices[0].FinishReason {
				t.Errorf("limited %v, k %d: finish_reason %s, want %s", limited, k, *r.Choices[0].FinishReason, *whole.Choices[0].FinishReason)
			}
			if r.Usage.PromptTokens != whole.Usage.PromptTokens+k || r.Usage.CompletionTokens != whole.Usage.CompletionTokens-k {
				t.Errorf("limited %v, k %d: usage %+v, want prompt %d completion %d", limited, k, r.Usage,
					whole.Usage.PromptTokens+k, whole.Usage.CompletionTokens-k)
			}
		}
	}
}

// TestContinueStreamedCompletion checks the /v1/completions form: the prompt
// followed by the text so far continues, streamed, with the rest.
func TestContinueStreamedCompletion(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	prompt := "Once upon a time.\n"
	whole := streamText(t, url+"/v1/completions", map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 30, "stream": true})
	pieces := splitPieces(whole)
	for _, k := range []int{1, 13, 29} {
		partial := strings.Join(pieces[:k], "")
		rest := streamText(t, url+"/v1/completions", map[string]any{"model": testModel, "prompt": prompt + partial, "max_tokens": 30 - k, "stream": true})
		if partial+rest != whole {
			t.Errorf("k %d: continued text\n%q\nwant\n%q", k, partial+rest, whole)
		}
	}
}

// TestContinueFinalMessageRules checks vLLM's rule that the two template
// switches exclude each other.
func TestContinueFinalMessageRules(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	res, data := post(t, url+"/v1/chat/completions", map[string]any{
		"model":                  testModel,
		"messages":               []any{map[string]any{"role": "user", "content": "hi"}, map[string]any{"role": "assistant", "content": "The"}},
		"continue_final_message": true,
	})
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(data), "Cannot set both") {
		t.Errorf("status %d %s, want 400 naming both switches", res.StatusCode, data)
	}
}

// splitPieces cuts generated text into its tokens' texts.
func splitPieces(text string) []string {
	var out []string
	for i := 0; i < len(text); {
		j := i + 1
		for j < len(text) && text[j] != ' ' && text[j] != '.' && text[j] != ',' && text[j-1] != '.' && text[j-1] != ',' {
			j++
		}
		out = append(out, text[i:j])
		i = j
	}
	if n := tokenizer.Count(text); n != len(out) {
		panic("splitPieces: pieces do not match tokens")
	}
	return out
}

// streamText streams a request and returns the text of its content chunks.
func streamText(t *testing.T, url string, body map[string]any) string {
	t.Helper()
	events, _ := stream(t, url, body)
	var b strings.Builder
	for _, ev := range events {
		if ev == "[DONE]" {
			break
		}
		var c struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatal(err)
		}
		for _, ch := range c.Choices {
			b.WriteString(ch.Text + ch.Delta.Content)
		}
	}
	return b.String()
}
