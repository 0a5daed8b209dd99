package emulator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/tokenizer"
)

func chatBody(msgs []tokenizer.Message, extra map[string]any) map[string]any {
	ms := make([]map[string]any, len(msgs))
	for i, m := range msgs {
		ms[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	b := map[string]any{"model": testModel, "messages": ms}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func TestChatCompletion(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	msgs := []tokenizer.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "What is a cat?"}}
	promptLen := len(tokenizer.EncodeChat(nil, msgs, true))

	t.Run("max_tokens", func(t *testing.T) {
		r, h := complete(t, url+"/v1/chat/completions", chatBody(msgs, map[string]any{"max_tokens": 10}))
		if !strings.HasPrefix(r.ID, "chatcmpl-") || r.Object != "chat.completion" || r.Model != testModel || r.Created == 0 {
			t.Errorf("id %q object %q model %q created %d", r.ID, r.Object, r.Model, r.Created)
		}
		c := r.Choices[0]
		if c.Message == nil || c.Message.Role != "assistant" || c.Message.Content == "" {
			t.Fatalf("message %+v", c.Message)
		}
		if got := tokenizer.Count(c.Message.Content); got != 10 {
			t.Errorf("content is %d tokens, want 10", got)
		}
		if c.FinishReason == nil || *c.FinishReason != "length" {
			t.Errorf("finish_reason %v, want length", c.FinishReason)
		}
		want := usageJSON{PromptTokens: promptLen, CompletionTokens: 10, TotalTokens: promptLen + 10}
		if u := *r.Usage; u.PromptTokens != want.PromptTokens || u.CompletionTokens != 10 ||
			u.TotalTokens != want.TotalTokens || u.PromptTokensDetails.CachedTokens != 0 {
			t.Errorf("usage %+v, want %+v and no cached tokens", u, want)
		}
		if ttft := headerSeconds(t, h, HeaderModelTTFT); ttft <= 0 || ttft > headerSeconds(t, h, HeaderModelLatency) {
			t.Errorf("model TTFT %v, latency %v", ttft, h.Get(HeaderModelLatency))
		}
	})

	t.Run("max_completion_tokens wins", func(t *testing.T) {
		r, _ := complete(t, url+"/v1/chat/completions",
			chatBody(msgs, map[string]any{"max_tokens": 10, "max_completion_tokens": 3}))
		if r.Usage.CompletionTokens != 3 {
			t.Errorf("completion_tokens %d, want 3", r.Usage.CompletionTokens)
		}
	})

	t.Run("natural length", func(t *testing.T) {
		r, _ := complete(t, url+"/v1/chat/completions", chatBody(msgs, nil))
		n := r.Usage.CompletionTokens
		if n < minNaturalTokens || n > maxNaturalTokens {
			t.Errorf("completion_tokens %d, want %d..%d", n, minNaturalTokens, maxNaturalTokens)
		}
		if got := tokenizer.Count(r.Choices[0].Message.Content); got != n-1 {
			t.Errorf("content is %d tokens, want %d (the EOT is not text)", got, n-1)
		}
		if fr := r.Choices[0].FinishReason; fr == nil || *fr != "stop" {
			t.Errorf("finish_reason %v, want stop", fr)
		}
	})

	t.Run("content parts", func(t *testing.T) {
		body := map[string]any{"messages": []any{
			map[string]any{"role": "developer", "content": []any{
				map[string]any{"type": "text", "text": "Be brief."},
				map[string]any{"type": "text", "text": "Be kind."},
			}},
			map[string]any{"role": "user", "content": "hi"},
		}, "max_tokens": 1}
		r, _ := complete(t, url+"/v1/chat/completions", body)
		want := len(tokenizer.EncodeChat(nil, []tokenizer.Message{
			{Role: "developer", Content: "Be brief.\nBe kind."}, {Role: "user", Content: "hi"}}, true))
		if r.Usage.PromptTokens != want {
			t.Errorf("prompt_tokens %d, want %d", r.Usage.PromptTokens, want)
		}
		if r.Model != testModel {
			t.Errorf("model %q, want the served model when the request names none", r.Model)
		}
	})
}

func TestCompletion(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	text := "Once upon a time"
	textLen := len(tokenizer.Encode(nil, text)) + 1 // BOS
	tests := []struct {
		name       string
		prompt     any
		wantPrompt int
	}{
		{"string", text, textLen},
		{"one string", []string{text}, textLen},
		{"token ids", []int{1, 2, 3, 128000}, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, h := complete(t, url+"/v1/completions", map[string]any{"model": testModel, "prompt": tt.prompt, "max_tokens": 7})
			if !strings.HasPrefix(r.ID, "cmpl-") || r.Object != "text_completion" || r.Model != testModel {
				t.Errorf("id %q object %q model %q", r.ID, r.Object, r.Model)
			}
			c := r.Choices[0]
			if c.Text == nil || tokenizer.Count(*c.Text) != 7 {
				t.Errorf("text %v, want 7 tokens", c.Text)
			}
			if c.FinishReason == nil || *c.FinishReason != "length" {
				t.Errorf("finish_reason %v", c.FinishReason)
			}
			if u := r.Usage; u.PromptTokens != tt.wantPrompt || u.CompletionTokens != 7 || u.TotalTokens != tt.wantPrompt+7 {
				t.Errorf("usage %+v, want %d prompt tokens", u, tt.wantPrompt)
			}
			if h.Get(HeaderModelTTFT) == "" {
				t.Errorf("no %s header", HeaderModelTTFT)
			}
		})
	}
}

func TestStreamingChatMatchesNonStreaming(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	msgs := []tokenizer.Message{{Role: "user", Content: "Tell me a story about a cat."}}
	for _, maxTokens := range []any{nil, 25} {
		t.Run(fmt.Sprint("max_tokens=", maxTokens), func(t *testing.T) {
			extra := map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true}}
			if maxTokens != nil {
				extra["max_tokens"] = maxTokens
			}
			events, resp := stream(t, url+"/v1/chat/completions", chatBody(msgs, extra))
			if len(events) < 4 || events[len(events)-1] != "[DONE]" {
				t.Fatalf("want role, tokens, finish, usage and [DONE], got %q", events)
			}
			var (
				content strings.Builder
				finish  string
				usage   *usageJSON
				id      string
				tokens  int
			)
			for i, e := range events[:len(events)-1] {
				var c responseJSON
				if err := json.Unmarshal([]byte(e), &c); err != nil {
					t.Fatalf("event %d %q: %v", i, e, err)
				}
				if c.Object != "chat.completion.chunk" || c.Model != testModel || !strings.HasPrefix(c.ID, "chatcmpl-") {
					t.Errorf("event %d: object %q model %q id %q", i, c.Object, c.Model, c.ID)
				}
				if id == "" {
					id = c.ID
				} else if c.ID != id {
					t.Errorf("event %d: id %q, want %q", i, c.ID, id)
				}
				if c.Usage != nil {
					if i != len(events)-2 || len(c.Choices) != 0 {
						t.Errorf("usage chunk %d of %d has %d choices", i, len(events), len(c.Choices))
					}
					usage = c.Usage
					continue
				}
				if len(c.Choices) != 1 || c.Choices[0].Delta == nil {
					t.Fatalf("event %d: %q", i, e)
				}
				d := c.Choices[0].Delta
				if i == 0 {
					if d.Role == nil || *d.Role != "assistant" || d.Content == nil || *d.Content != "" {
						t.Errorf("first delta %q, want role assistant and empty content", e)
					}
					continue
				}
				if fr := c.Choices[0].FinishReason; fr != nil {
					finish = *fr
					continue
				}
				if finish != "" {
					t.Errorf("event %d after the finish chunk: %q", i, e)
				}
				if d.Content == nil {
					t.Fatalf("event %d has no content: %q", i, e)
				}
				content.WriteString(*d.Content)
				tokens++
			}
			if usage == nil {
				t.Fatal("no usage chunk")
			}
			if resp.Trailer.Get(HeaderModelTTFT) == "" {
				t.Errorf("no %s trailer", HeaderModelTTFT)
			}

			delete(extra, "stream")
			delete(extra, "stream_options")
			r, _ := complete(t, url+"/v1/chat/completions", chatBody(msgs, extra))
			if got, want := content.String(), r.Choices[0].Message.Content; got != want {
				t.Errorf("streamed content %q\nwant %q", got, want)
			}
			if finish != *r.Choices[0].FinishReason {
				t.Errorf("streamed finish_reason %q, want %q", finish, *r.Choices[0].FinishReason)
			}
			if usage.PromptTokens != r.Usage.PromptTokens || usage.CompletionTokens != r.Usage.CompletionTokens {
				t.Errorf("streamed usage %+v, non-streaming %+v", *usage, *r.Usage)
			}
			wantTokens := usage.CompletionTokens
			if finish == "stop" {
				wantTokens-- // the EOT has no chunk
			}
			if tokens != wantTokens {
				t.Errorf("%d token chunks, want %d", tokens, wantTokens)
			}
		})
	}
}

func TestStreamingCompletion(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	body := map[string]any{"prompt": "The quick brown fox", "max_tokens": 12, "stream": true}
	events, _ := stream(t, url+"/v1/completions", body)
	if len(events) != 12+2 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("want 12 tokens, a finish chunk and [DONE], got %q", events)
	}
	var text strings.Builder
	for i, e := range events[:len(events)-1] {
		var c responseJSON
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatal(err)
		}
		if c.Object != "text_completion" || len(c.Choices) != 1 || c.Choices[0].Text == nil || c.Usage != nil {
			t.Fatalf("event %d: %q", i, e)
		}
		text.WriteString(*c.Choices[0].Text)
		if last := i == len(events)-2; last != (c.Choices[0].FinishReason != nil) {
			t.Errorf("event %d: finish_reason %v", i, c.Choices[0].FinishReason)
		}
	}
	delete(body, "stream")
	r, _ := complete(t, url+"/v1/completions", body)
	if text.String() != *r.Choices[0].Text {
		t.Errorf("streamed %q, want %q", text.String(), *r.Choices[0].Text)
	}
}

func TestRepeatedPromptHitsCache(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	body := map[string]any{"prompt": words(6000), "max_tokens": 4}
	first, h1 := complete(t, url+"/v1/completions", body)
	second, h2 := complete(t, url+"/v1/completions", body)

	p := first.Usage.PromptTokens
	if got := first.Usage.PromptTokensDetails.CachedTokens; got != 0 {
		t.Errorf("first request: %d cached tokens, want 0", got)
	}
	// All full blocks but the one holding the last prompt token, which must
	// be recomputed to sample from.
	if got, want := second.Usage.PromptTokensDetails.CachedTokens, (p-1)/16*16; got != want {
		t.Errorf("second request: %d cached tokens, want %d of %d", got, want, p)
	}
	ttft1, ttft2 := headerSeconds(t, h1, HeaderModelTTFT), headerSeconds(t, h2, HeaderModelTTFT)
	if !(ttft2 < ttft1/5) {
		t.Errorf("model TTFT %vs then %vs: the cached prefill should be far faster", ttft1, ttft2)
	}
	if *first.Choices[0].Text != *second.Choices[0].Text {
		t.Errorf("equal prompts gave different text: %q, %q", *first.Choices[0].Text, *second.Choices[0].Text)
	}

	fams := scrape(t, url)
	if got := metricValue(t, fams, "vllm:time_to_first_token_seconds"); got != 2 {
		t.Errorf("TTFT histogram has %v samples, want 2", got)
	}
	h := fams["vllm:time_to_first_token_seconds"].GetMetric()[0].GetHistogram()
	if sum := h.GetSampleSum(); sum < ttft1+ttft2-1e-5 || sum > ttft1+ttft2+1e-5 {
		t.Errorf("TTFT histogram sum %v, want %v", sum, ttft1+ttft2)
	}
	if got, want := metricValue(t, fams, "vllm:prefix_cache_hits_total"), float64((p-1)/16*16); got != want {
		t.Errorf("prefix_cache_hits_total %v, want %v", got, want)
	}
	if got := metricValue(t, fams, "vllm:prefix_cache_queries_total"); got != float64(2*p) {
		t.Errorf("prefix_cache_queries_total %v, want %v", got, 2*p)
	}
}

func TestNextTurnHitsCache(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	msgs := []tokenizer.Message{
		{Role: "system", Content: words(500)},
		{Role: "user", Content: "Summarise the above."},
	}
	turn1, _ := complete(t, url+"/v1/chat/completions", chatBody(msgs, nil))
	reply := turn1.Choices[0].Message.Content
	msgs = append(msgs,
		tokenizer.Message{Role: "assistant", Content: reply},
		tokenizer.Message{Role: "user", Content: "Now in French."})
	turn2, _ := complete(t, url+"/v1/chat/completions", chatBody(msgs, nil))

	// Turn 1 computed its prompt and all but its last output token (the EOT,
	// sampled but never fed back); turn 2's prompt starts with all of them.
	seq := turn1.Usage.PromptTokens + turn1.Usage.CompletionTokens
	lo, hi := (seq-1)/16*16, seq/16*16
	if got := turn2.Usage.PromptTokensDetails.CachedTokens; got < lo || got > hi {
		t.Errorf("turn 2: %d cached tokens, want %d..%d (turn 1: %d prompt + %d output)",
			got, lo, hi, turn1.Usage.PromptTokens, turn1.Usage.CompletionTokens)
	}
	if turn2.Usage.PromptTokens <= seq {
		t.Errorf("turn 2 prompt %d tokens, want more than turn 1's %d", turn2.Usage.PromptTokens, seq)
	}
}

func TestOutputDependsOnSeedAndPrompt(t *testing.T) {
	text := func(seed uint64, prompt string) string {
		_, url := startServer(t, Config{Seed: seed}, nil)
		r, _ := complete(t, url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 20})
		return *r.Choices[0].Text
	}
	a := text(1, "hello")
	if b := text(1, "hello"); a != b {
		t.Errorf("equal seed and prompt: %q vs %q", a, b)
	}
	if b := text(2, "hello"); a == b {
		t.Errorf("different seeds gave the same text %q", a)
	}
	if b := text(1, "goodbye"); a == b {
		t.Errorf("different prompts gave the same text %q", a)
	}
}

func TestNaturalLengthCappedByContext(t *testing.T) {
	p := testProfile(t, func(p *engine.Profile) { p.MaxModelLen = 40 })
	_, url := startServer(t, Config{Profile: p}, nil)
	r, _ := complete(t, url+"/v1/completions", map[string]any{"prompt": words(30)})
	if got, want := r.Usage.CompletionTokens, 40-r.Usage.PromptTokens; got != want {
		t.Errorf("completion_tokens %d, want the %d left in the context", got, want)
	}
	if fr := *r.Choices[0].FinishReason; fr != "length" {
		t.Errorf("finish_reason %q, want length", fr)
	}
}

func TestModelsAndHealth(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			Object      string `json:"object"`
			OwnedBy     string `json:"owned_by"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != testModel ||
		list.Data[0].Object != "model" || list.Data[0].MaxModelLen != 131072 {
		t.Errorf("models %+v", list)
	}
	h, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	h.Body.Close()
	if h.StatusCode != http.StatusOK {
		t.Errorf("/health: %d", h.StatusCode)
	}
}

func TestBadRequests(t *testing.T) {
	p := testProfile(t, nil)
	_, url := startServer(t, Config{Profile: p}, nil)
	const chat, cmpl = "/v1/chat/completions", "/v1/completions"
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		wantStatus int
		wantCode   string
	}{
		{"GET chat", http.MethodGet, chat, "", 405, "method_not_allowed"},
		{"PUT completions", http.MethodPut, cmpl, "{}", 405, "method_not_allowed"},
		{"POST models", http.MethodPost, "/v1/models", "{}", 405, "method_not_allowed"},
		{"unknown path", http.MethodPost, "/v1/embeddings", "{}", 404, "not_found"},
		{"malformed JSON", http.MethodPost, chat, `{"messages": [`, 400, ""},
		{"trailing garbage", http.MethodPost, chat, `{` + msgs + `} x`, 400, ""},
		{"empty body", http.MethodPost, chat, ``, 400, ""},
		{"not an object", http.MethodPost, chat, `[1, 2]`, 400, ""},
		{"no messages", http.MethodPost, chat, `{"model":"test-model"}`, 400, ""},
		{"messages not an array", http.MethodPost, chat, `{"messages":"hi"}`, 400, ""},
		{"empty messages", http.MethodPost, chat, `{"messages":[]}`, 400, ""},
		{"message not an object", http.MethodPost, chat, `{"messages":["hi"]}`, 400, ""},
		{"no role", http.MethodPost, chat, `{"messages":[{"content":"hi"}]}`, 400, ""},
		{"unknown role", http.MethodPost, chat, `{"messages":[{"role":"robot","content":"hi"}]}`, 400, ""},
		{"no user content", http.MethodPost, chat, `{"messages":[{"role":"user"}]}`, 400, ""},
		{"content a number", http.MethodPost, chat, `{"messages":[{"role":"user","content":5}]}`, 400, ""},
		{"image part", http.MethodPost, chat, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, ""},
		{"part without text", http.MethodPost, chat, `{"messages":[{"role":"user","content":[{"type":"text"}]}]}`, 400, ""},
		{"max_tokens zero", http.MethodPost, chat, `{` + msgs + `,"max_tokens":0}`, 400, ""},
		{"max_tokens negative", http.MethodPost, chat, `{` + msgs + `,"max_tokens":-3}`, 400, ""},
		{"max_tokens fraction", http.MethodPost, chat, `{` + msgs + `,"max_tokens":1.5}`, 400, ""},
		{"max_tokens string", http.MethodPost, chat, `{` + msgs + `,"max_tokens":"10"}`, 400, ""},
		{"max_completion_tokens zero", http.MethodPost, chat, `{` + msgs + `,"max_completion_tokens":0}`, 400, ""},
		{"n 2", http.MethodPost, chat, `{` + msgs + `,"n":2}`, 400, ""},
		{"stream not a boolean", http.MethodPost, chat, `{` + msgs + `,"stream":"yes"}`, 400, ""},
		{"model a number", http.MethodPost, chat, `{` + msgs + `,"model":7}`, 400, ""},
		{"unknown model", http.MethodPost, chat, `{` + msgs + `,"model":"gpt-4o"}`, 404, "model_not_found"},
		{"context exceeded", http.MethodPost, chat, `{` + msgs + `,"max_tokens":131072}`, 400, "context_length_exceeded"},
		{"prompt missing", http.MethodPost, cmpl, `{"max_tokens":3}`, 400, ""},
		{"prompt a number", http.MethodPost, cmpl, `{"prompt":5}`, 400, ""},
		{"two prompts", http.MethodPost, cmpl, `{"prompt":["a","b"]}`, 400, ""},
		{"empty prompt array", http.MethodPost, cmpl, `{"prompt":[]}`, 400, ""},
		{"bad token id", http.MethodPost, cmpl, `{"prompt":[1,-1]}`, 400, ""},
		{"token id too big", http.MethodPost, cmpl, `{"prompt":[128256]}`, 400, ""},
		{"batched token ids", http.MethodPost, cmpl, `{"prompt":[[1,2]]}`, 400, ""},
		{"completion n 3", http.MethodPost, cmpl, `{"prompt":"a","n":3}`, 400, ""},
		{"completion unknown model", http.MethodPost, cmpl, `{"prompt":"a","model":"x"}`, 404, "model_not_found"},
		{"completion context exceeded", http.MethodPost, cmpl, `{"prompt":"a","max_tokens":200000}`, 400, "context_length_exceeded"},
		{"body too large", http.MethodPost, cmpl, `{"prompt":"` + strings.Repeat("a", maxBodyBytes) + `"}`, 413, "request_too_large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, url+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			data, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.wantStatus, data)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			var e errorJSON
			if err := json.Unmarshal(data, &e); err != nil || e.Error == nil || e.Error.Message == "" {
				t.Fatalf("want an OpenAI error body, got %s (%v)", data, err)
			}
			if e.Error.Type != "invalid_request_error" {
				t.Errorf("type %q", e.Error.Type)
			}
			if tt.wantCode != "" && (e.Error.Code == nil || *e.Error.Code != tt.wantCode) {
				t.Errorf("code %v, want %q: %s", e.Error.Code, tt.wantCode, data)
			}
		})
	}

	// Nothing above may have left work behind.
	fams := scrape(t, url)
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens_total"} {
		if got := metricValue(t, fams, name); got != 0 {
			t.Errorf("%s = %v after rejected requests", name, got)
		}
	}
}

func TestRequestLargerThanKVCache(t *testing.T) {
	p := testProfile(t, func(p *engine.Profile) { p.NumGPUBlocks = 8 })
	_, url := startServer(t, Config{Profile: p}, nil)
	resp, data := post(t, url+"/v1/completions", map[string]any{"prompt": words(200), "max_tokens": 10})
	var e errorJSON
	_ = json.Unmarshal(data, &e)
	if resp.StatusCode != 400 || e.Error == nil || e.Error.Code == nil || *e.Error.Code != "context_length_exceeded" {
		t.Errorf("status %d: %s", resp.StatusCode, data)
	}
}

// TestClientDisconnectAbortsRequest runs in real time so that the request is
// still generating when the client goes away.
func TestClientDisconnectAbortsRequest(t *testing.T) {
	returned := make(chan struct{}, 1)
	wrap := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(w, r)
			if r.URL.Path == "/v1/chat/completions" {
				returned <- struct{}{}
			}
		})
	}
	_, url := startServer(t, Config{Clock: realClock{}, TimeScale: 1}, wrap)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body, _ := json.Marshal(chatBody([]tokenizer.Message{{Role: "user", Content: words(1000)}},
		map[string]any{"stream": true, "max_tokens": 5000})) // about 40 s of decoding
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// Read up to the first token: the request is then running and holds
	// KV blocks.
	buf := make([]byte, 0, 4096)
	for !bytes.Contains(buf, []byte(`"delta":{"content":`)) {
		tmp := make([]byte, 1024)
		n, err := resp.Body.Read(tmp)
		buf = append(buf, tmp[:n]...)
		if err != nil {
			t.Fatalf("stream ended before the first token: %v: %s", err, buf)
		}
	}
	fams := scrape(t, url)
	if got := metricValue(t, fams, "vllm:num_requests_running"); got != 1 {
		t.Errorf("running %v while streaming, want 1", got)
	}
	if got := metricValue(t, fams, "vllm:kv_cache_usage_perc"); got <= 0 {
		t.Errorf("kv_cache_usage_perc %v while streaming, want > 0", got)
	}

	cancel()
	resp.Body.Close()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("handler did not return after the client disconnected")
	}
	fams = scrape(t, url)
	for name, want := range map[string]float64{
		"vllm:num_requests_running": 0,
		"vllm:num_requests_waiting": 0,
		"vllm:kv_cache_usage_perc":  0,
	} {
		if got := metricValue(t, fams, name); got != want {
			t.Errorf("%s = %v after disconnect, want %v", name, got, want)
		}
	}
	var aborted float64
	for _, m := range fams["vllm:request_success_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "finished_reason" && l.GetValue() == "abort" {
				aborted = m.GetCounter().GetValue()
			}
		}
	}
	if aborted != 1 {
		t.Errorf("request_success_total{finished_reason=abort} = %v, want 1", aborted)
	}
}

func TestMetricsNames(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	complete(t, url+"/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 3})

	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	label := `{model_name="` + testModel + `"}`
	for _, line := range []string{
		"vllm:num_requests_running" + label + " 0",
		"vllm:num_requests_waiting" + label + " 0",
		"vllm:kv_cache_usage_perc" + label + " 0",
		"vllm:prompt_tokens_total" + label + " 2",
		"vllm:generation_tokens_total" + label + " 3",
		"vllm:prefix_cache_queries_total" + label + " 2",
		"vllm:prefix_cache_hits_total" + label + " 0",
		"vllm:num_preemptions_total" + label + " 0",
		`vllm:request_success_total{finished_reason="length",model_name="` + testModel + `"} 1`,
		`vllm:cache_config_info{block_size="16",enable_prefix_caching="True",model_name="` + testModel + `",num_gpu_blocks="24766"} 1`,
		"vllm:time_to_first_token_seconds_count" + label + " 1",
		"vllm:inter_token_latency_seconds_count" + label + " 2",
		"vllm:e2e_request_latency_seconds_count" + label + " 1",
	} {
		if !bytes.Contains(text, []byte("\n"+line+"\n")) {
			t.Errorf("/metrics lacks the line %q", line)
		}
	}
	fams := scrape(t, url)
	for name, typ := range map[string]string{
		"vllm:num_requests_running":        "GAUGE",
		"vllm:kv_cache_usage_perc":         "GAUGE",
		"vllm:prompt_tokens_total":         "COUNTER",
		"vllm:request_success_total":       "COUNTER",
		"vllm:time_to_first_token_seconds": "HISTOGRAM",
		"vllm:inter_token_latency_seconds": "HISTOGRAM",
		"vllm:e2e_request_latency_seconds": "HISTOGRAM",
		"vllm:cache_config_info":           "GAUGE",
		"vllm:num_preemptions_total":       "COUNTER",
		"vllm:prefix_cache_hits_total":     "COUNTER",
		"vllm:prefix_cache_queries_total":  "COUNTER",
		"vllm:generation_tokens_total":     "COUNTER",
		"vllm:num_requests_waiting":        "GAUGE",
		"vllm:gpu_cache_usage_perc":        "GAUGE",
	} {
		if f := fams[name]; f == nil || f.GetType().String() != typ {
			t.Errorf("%s: want a %s, got %v", name, typ, f.GetType())
		}
	}
}

// TestConcurrentStreams runs many streams at once at a time scale the driver
// cannot keep up with: it must fall behind gracefully.
func TestConcurrentStreams(t *testing.T) {
	_, url := startServer(t, Config{Clock: realClock{}, TimeScale: 1e-4}, nil)
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			n := 5 + i*3
			body := map[string]any{"prompt": words(100 + 50*i), "max_tokens": n, "stream": true}
			events, _ := stream(t, url+"/v1/completions", body)
			if len(events) != n+2 || events[len(events)-1] != "[DONE]" {
				t.Errorf("request %d: %d events, want %d", i, len(events), n+2)
			}
		})
	}
	wg.Wait()
	fams := scrape(t, url)
	if got := metricValue(t, fams, "vllm:e2e_request_latency_seconds"); got != 32 {
		t.Errorf("%v requests finished, want 32", got)
	}
	if got := metricValue(t, fams, "vllm:kv_cache_usage_perc"); got != 0 {
		t.Errorf("kv_cache_usage_perc %v when idle", got)
	}
}

// stuckClock never lets time pass: the driver's first sleep lasts until the
// server stops. It reports each sleep on sleeping.
type stuckClock struct {
	fakeClock
	sleeping chan struct{}
}

func (c *stuckClock) After(time.Duration) <-chan time.Time {
	select {
	case c.sleeping <- struct{}{}:
	default:
	}
	return nil
}

func TestStopFailsInFlightRequests(t *testing.T) {
	for _, streamIt := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", streamIt), func(t *testing.T) {
			clock := &stuckClock{fakeClock: *newFakeClock(), sleeping: make(chan struct{}, 1)}
			s, err := New(Config{Model: testModel, Clock: clock, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()

			w := httptest.NewRecorder()
			served := make(chan struct{})
			go func() {
				body := fmt.Sprintf(`{"prompt":"hi","max_tokens":5,"stream":%v}`, streamIt)
				s.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body)))
				close(served)
			}()
			<-clock.sleeping // the driver took the request and sleeps through its first step
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			<-served
			body := w.Body.String()
			if streamIt {
				if w.Code != http.StatusOK || !strings.Contains(body, `"error"`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
					t.Errorf("status %d body %q: want a stream ending in an error event", w.Code, body)
				}
			} else if w.Code != http.StatusServiceUnavailable {
				t.Errorf("status %d body %q: want 503", w.Code, body)
			}
			if st := s.Stats(); st.Running+st.Waiting != 0 || st.UsedBlocks != 0 {
				t.Errorf("engine after stop: %+v", st)
			}

			// New requests are refused, and the server cannot run again.
			w = httptest.NewRecorder()
			s.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"hi"}`)))
			if w.Code != http.StatusServiceUnavailable {
				t.Errorf("after stop: status %d", w.Code)
			}
			w = httptest.NewRecorder()
			s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/health", nil))
			if w.Code != http.StatusServiceUnavailable {
				t.Errorf("/health after stop: status %d", w.Code)
			}
			if err := s.Run(context.Background()); err == nil {
				t.Error("second Run succeeded")
			}
		})
	}
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"negative time scale", Config{TimeScale: -1}},
		{"invalid profile", Config{Profile: engine.Profile{Name: "broken", BlockSize: 16}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); err == nil {
				t.Error("New succeeded")
			}
		})
	}
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Model() != "meta-llama/Llama-3.1-8B-Instruct" || s.Profile().Name != engine.DefaultProfile {
		t.Errorf("defaults: model %q profile %q", s.Model(), s.Profile().Name)
	}
}

func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "plain", ` quote " and \ slash`, "tab\tnew\nline\r\x01\x1f", "héllo ✓ 日本", "bad \xff byte", "<&>"} {
		var want any
		got := appendJSONString(nil, s)
		if err := json.Unmarshal(got, &want); err != nil {
			t.Errorf("%q: %s is not JSON: %v", s, got, err)
			continue
		}
		if dec := want.(string); dec != strings.ToValidUTF8(s, "\uFFFD") {
			t.Errorf("%q round-trips to %q", s, dec)
		}
	}
}

func TestNaturalLength(t *testing.T) {
	lo, hi, sum := maxNaturalTokens, 0, 0
	const n = 10000
	for i := range uint64(n) {
		l := naturalLength(i)
		lo, hi, sum = min(lo, l), max(hi, l), sum+l
	}
	if lo != minNaturalTokens || hi < maxNaturalTokens-5 || hi > maxNaturalTokens {
		t.Errorf("lengths in [%d, %d], want [%d, %d]", lo, hi, minNaturalTokens, maxNaturalTokens)
	}
	if mean := sum / n; mean < 120 || mean > 165 {
		t.Errorf("mean length %d, want about 142", mean)
	}
}
