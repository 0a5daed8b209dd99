//go:build unix

package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/testfleet"
)

// messagesTurn is what a client saw of one turn over the Messages API or
// chat: the reply, the backend that served it, and the usage as the
// backend reported it (prompt tokens in all, cached among them).
type messagesTurn struct {
	reply, stopReason, backend string
	events                     []string // a stream's event types, in order
	prompt, cached, output     int
}

// postMessages sends a Messages API request through the router and reads
// the answer, streamed or not; an answer other than 200 fails the test.
func postMessages(t *testing.T, url string, req map[string]any) messagesTurn {
	t.Helper()
	data, _ := json.Marshal(req)
	res, err := http.Post(url+"/v1/messages", "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(res.Body)
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	turn := messagesTurn{backend: res.Header.Get(proxy.HeaderBackend)}
	type usage struct {
		InputTokens          int `json:"input_tokens"`
		CacheReadInputTokens int `json:"cache_read_input_tokens"`
		OutputTokens         int `json:"output_tokens"`
	}
	if req["stream"] != true {
		var m struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
			StopReason string `json:"stop_reason"`
			Usage      usage  `json:"usage"`
		}
		if err := json.NewDecoder(res.Body).Decode(&m); err != nil || len(m.Content) != 1 {
			t.Fatalf("message: %+v %v", m, err)
		}
		turn.reply, turn.stopReason = m.Content[0].Text, m.StopReason
		turn.prompt, turn.cached, turn.output = m.Usage.InputTokens+m.Usage.CacheReadInputTokens, m.Usage.CacheReadInputTokens, m.Usage.OutputTokens
		return turn
	}
	var text strings.Builder
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 1<<20)
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
			Type    string `json:"type"`
			Message struct {
				Usage usage `json:"usage"`
			} `json:"message"`
			Delta struct {
				Text       string `json:"text"`
				StopReason string `json:"stop_reason"`
			} `json:"delta"`
			Usage usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(payload), &ev); err != nil || ev.Type != event {
			t.Fatalf("event %q, data %s: %v", event, payload, err)
		}
		turn.events = append(turn.events, ev.Type)
		switch ev.Type {
		case "message_start":
			u := ev.Message.Usage
			turn.prompt, turn.cached = u.InputTokens+u.CacheReadInputTokens, u.CacheReadInputTokens
		case "content_block_delta":
			text.WriteString(ev.Delta.Text)
		case "message_delta":
			turn.stopReason, turn.output = ev.Delta.StopReason, ev.Usage.OutputTokens
		case "error":
			t.Fatalf("error event: %s", payload)
		}
	}
	turn.reply = text.String()
	return turn
}

// postChat is postMessages over /v1/chat/completions, not streamed.
func postChat(t *testing.T, url string, req map[string]any) messagesTurn {
	t.Helper()
	data, _ := json.Marshal(req)
	res, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var c struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			CompletionTokens    int `json:"completion_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(res.Body).Decode(&c); err != nil || res.StatusCode != http.StatusOK || len(c.Choices) != 1 {
		t.Fatalf("chat: status %d, %+v %v", res.StatusCode, c, err)
	}
	return messagesTurn{reply: c.Choices[0].Message.Content, backend: res.Header.Get(proxy.HeaderBackend),
		prompt: c.Usage.PromptTokens, cached: c.Usage.PromptTokensDetails.CachedTokens, output: c.Usage.CompletionTokens}
}

// TestMessagesThroughServe: /v1/messages through kvroute serve on emulator
// processes, not streamed and streamed: the text, stop reason, Anthropic's
// events and usage reach the client; the second turn goes where the first
// was cached and reads it from there; kvroute's own errors are in
// Anthropic's shape.
func TestMessagesThroughServe(t *testing.T) {
	emus := testfleet.Start(t, 3, "--seed", "3", "--time-scale", "0.05")
	s := startRouter(t, emus, func(c *Config) { c.Router.Seed = 1 })
	system := strings.Repeat("You are a careful assistant for a cache-aware router. ", 40)
	msgs := []map[string]any{{"role": "user", "content": "What does a KV cache hold?"}}
	turn1 := postMessages(t, s.URL, map[string]any{"model": model, "max_tokens": 12, "system": system,
		"metadata": map[string]any{"user_id": "u-1"}, "messages": msgs})
	if turn1.reply == "" || turn1.stopReason == "" || turn1.prompt < 400 || turn1.output < 1 || turn1.backend == "" {
		t.Fatalf("turn 1 %+v", turn1)
	}
	msgs = append(msgs, map[string]any{"role": "assistant", "content": []map[string]any{{"type": "text", "text": turn1.reply}}},
		map[string]any{"role": "user", "content": "And why route by it?"})
	turn2 := postMessages(t, s.URL, map[string]any{"model": model, "max_tokens": 12, "system": system, "stream": true,
		"metadata": map[string]any{"user_id": "u-1"}, "messages": msgs})
	events := strings.Join(turn2.events, " ")
	if !strings.HasPrefix(events, "message_start content_block_start content_block_delta") || !strings.HasSuffix(events, "message_delta message_stop") {
		t.Errorf("turn 2 events: %s", events)
	}
	if turn2.reply == "" || turn2.stopReason == "" || turn2.output < 1 {
		t.Errorf("turn 2 %+v", turn2)
	}
	if turn2.backend != turn1.backend || turn2.cached < turn1.prompt*3/4 {
		t.Errorf("turn 2 on %s with %d of %d prompt tokens cached; turn 1 was on %s with %d: want the same backend, turn 1 read from its cache",
			turn2.backend, turn2.cached, turn2.prompt, turn1.backend, turn1.prompt)
	}

	for _, tt := range []struct {
		name, body string
		status     int
		typ        string
	}{
		{"unknown model", `{"model":"nobody","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, 404, "not_found_error"},
		{"no max_tokens", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"x"}]}`, model), 400, "invalid_request_error"},
	} {
		res, err := http.Post(s.URL+"/v1/messages", "application/json", strings.NewReader(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Type  string `json:"type"`
			Error struct{ Type, Message string }
		}
		err = json.NewDecoder(res.Body).Decode(&e)
		res.Body.Close()
		if err != nil || res.StatusCode != tt.status || e.Type != "error" || e.Error.Type != tt.typ {
			t.Errorf("%s: %d %+v (%v), want %d %s", tt.name, res.StatusCode, e, err, tt.status, tt.typ)
		}
	}
}

// The multi-turn comparison of TestMessagesHitRateMatchesChat.
const (
	hitRateConversations = 12
	hitRateTurns         = 5
	hitRateBackends      = 4
)

// TestMessagesHitRateMatchesChat plays the same multi-turn conversations
// over /v1/messages and over /v1/chat/completions, each through kvroute
// serve on fresh emulator processes, and compares the hit rates the
// backends report (cached prompt tokens / prompt tokens): within a point;
// and, for scale, over /v1/messages with the random policy, which keeps no
// affinity. The numbers are in docs/BENCHMARKS.md ("The Messages API
// against chat").
func TestMessagesHitRateMatchesChat(t *testing.T) {
	rate := map[string]float64{}
	for _, run := range []string{"chat", "messages", "messages/random"} {
		api, policy, _ := strings.Cut(run, "/")
		emus := testfleet.Start(t, hitRateBackends, "--seed", "5", "--time-scale", "0.02")
		s := startRouter(t, emus, func(c *Config) {
			c.Router.Seed = 1
			if policy != "" {
				c.Policy = policy
			}
		})
		rng := rand.New(rand.NewPCG(30, 2))
		type conv struct {
			system string
			msgs   []map[string]any
		}
		convs := make([]conv, hitRateConversations)
		for i := range convs {
			convs[i].system = fmt.Sprintf("Conversation %d. ", i) + sentence(rng, 150)
		}
		var prompt, cached int
		// Turn by turn across the conversations, so that they share the
		// fleet as sessions do.
		for turn := range hitRateTurns {
			for i := range convs {
				c := &convs[i]
				c.msgs = append(c.msgs, map[string]any{"role": "user", "content": sentence(rng, 40+rng.IntN(60))})
				var got messagesTurn
				if api == "messages" {
					got = postMessages(t, s.URL, map[string]any{"model": model, "max_tokens": 16, "system": c.system,
						"metadata": map[string]any{"user_id": fmt.Sprint("u", i)}, "messages": c.msgs, "stream": turn%2 == 1})
				} else {
					msgs := append([]map[string]any{{"role": "system", "content": c.system}}, c.msgs...)
					got = postChat(t, s.URL, map[string]any{"model": model, "max_tokens": 16, "user": fmt.Sprint("u", i), "messages": msgs})
				}
				c.msgs = append(c.msgs, map[string]any{"role": "assistant", "content": got.reply})
				prompt, cached = prompt+got.prompt, cached+got.cached
			}
		}
		rate[run] = float64(cached) / float64(prompt)
		t.Logf("%-15s %d conversations × %d turns on %d backends: %d of %d prompt tokens cached, hit rate %.1f %%",
			run, hitRateConversations, hitRateTurns, hitRateBackends, cached, prompt, 100*rate[run])
	}
	if d := rate["messages"] - rate["chat"]; d > 0.01 || d < -0.01 {
		t.Errorf("hit rate over messages %.1f %%, over chat %.1f %%: want within a point", 100*rate["messages"], 100*rate["chat"])
	}
	// Cache-aware: every turn after the first finds its conversation,
	// which a policy blind to the cache does in one turn of four.
	if floor := 0.6 * float64(hitRateTurns-1) / float64(hitRateTurns); rate["messages"] < floor {
		t.Errorf("hit rate over messages %.1f %%, want at least %.0f %%", 100*rate["messages"], 100*floor)
	}
	if rate["messages/random"] > rate["messages"]-0.2 {
		t.Errorf("hit rate over messages %.1f %% with kvroute, %.1f %% with random: want kvroute's far above",
			100*rate["messages"], 100*rate["messages/random"])
	}
}

// sentence is n words drawn from rng.
func sentence(rng *rand.Rand, n int) string {
	words := [...]string{"cache", "prefix", "token", "router", "backend", "latency", "batch", "decode", "prefill",
		"block", "session", "agent", "tool", "reply", "queue", "memory"}
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	b.WriteByte('.')
	return b.String()
}

// TestMessagesStreamCut: a Messages stream whose emulator process dies
// after three tokens, or stalls after its first, ends with Anthropic's
// error event after what was sent, no [DONE]; it is not continued
// elsewhere, though the fault is on every backend and would show a second
// attempt.
func TestMessagesStreamCut(t *testing.T) {
	for _, tt := range []struct {
		name, fault, typ string
		faults           emulator.Faults
		deltas           int
	}{
		{"dies", "die", "api_error", emulator.Faults{DieAfterTokens: 3}, 3},
		{"stalls", "hang_after_first", "timeout_error", emulator.Faults{HangAfterFirst: true}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			emus := testfleet.Start(t, 2, "--seed", "8", "--time-scale", "0.05")
			for _, e := range emus {
				e.SetFaults(tt.faults)
			}
			s := startRouter(t, emus, func(c *Config) { c.Router.Seed = 1 })
			body := fmt.Sprintf(`{"model":%q,"max_tokens":12,"stream":true,"messages":[{"role":"user","content":"Tell me about caches."}]}`, model)
			res, err := http.Post(s.URL+"/v1/messages", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil || res.StatusCode != http.StatusOK {
				t.Fatalf("status %d, %v", res.StatusCode, err)
			}
			stream := string(data)
			head, tail, ok := strings.Cut(stream, "event: error\ndata: ")
			if !ok || strings.Contains(stream, "[DONE]") || !strings.HasPrefix(head, "event: message_start\n") ||
				strings.Count(head, "event: content_block_delta\n") != tt.deltas {
				t.Fatalf("stream %q: want message_start, %d deltas, then an error event", stream, tt.deltas)
			}
			var e struct {
				Type  string `json:"type"`
				Error struct{ Type, Message string }
			}
			if err := json.Unmarshal([]byte(strings.TrimSpace(tail)), &e); err != nil || e.Type != "error" || e.Error.Type != tt.typ {
				t.Errorf("error event %q (%v), want %s", tail, err, tt.typ)
			}
			if n := faultsServed(t, emus[0], tt.fault) + faultsServed(t, emus[1], tt.fault); n != 1 {
				t.Errorf("%v attempts met the fault, want 1: the stream was continued elsewhere", n)
			}
		})
	}
}
