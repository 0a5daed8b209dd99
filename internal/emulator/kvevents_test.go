package emulator

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/kvevents"
)

// waitFor polls cond until it holds or 10 s pass: events cross a real
// socket, with no event of their own to wait on.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func tokenize(t *testing.T, url string, body any) []int32 {
	t.Helper()
	resp, data := post(t, url+"/tokenize", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/tokenize: status %d: %s", resp.StatusCode, data)
	}
	var r tokenizeResponse
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	if r.Count != len(r.Tokens) {
		t.Fatalf("/tokenize: count %d for %d tokens", r.Count, len(r.Tokens))
	}
	return r.Tokens
}

// TestKVEventsEndToEnd runs an emulator publishing KV events over ZMQ on
// 127.0.0.1 and a subscriber: after a run of conversations that fills and
// evicts the cache, the subscriber's state holds exactly the blocks the
// engine holds; a prompt tokenized by /tokenize matches, block by block,
// what the engine then reports cached; a restarted emulator's events clear
// the state. It does so in each layout: vLLM's two and SGLang's (one page
// per event), each with a replay socket, without which a router that joins
// after the first batch can only know part of the state.
func TestKVEventsEndToEnd(t *testing.T) {
	for _, tt := range []struct {
		name   string
		format kvevents.Format
	}{
		{"vllm map", kvevents.FormatMap},
		{"vllm array", kvevents.FormatArray},
		{"sglang", kvevents.FormatSGLang},
	} {
		t.Run(tt.name, func(t *testing.T) { testKVEventsEndToEnd(t, tt.format) })
	}
}

func testKVEventsEndToEnd(t *testing.T, format kvevents.Format) {
	cfg := Config{
		Profile:  testProfile(t, func(p *engine.Profile) { p.NumGPUBlocks = 50 }), // evicts within the test
		KVEvents: &kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", Topic: "kv", Format: format},
	}
	s, url := startServer(t, cfg, nil)
	endpoint, replay := s.KVEventsAddr()
	store := kvevents.NewStore(kvevents.KeyTokens)
	ctx, cancel := context.WithCancel(context.Background())
	sub := kvevents.NewSubscriber(kvevents.Source{Name: "e0", Endpoint: endpoint, Replay: replay, Topic: "kv"}, store,
		kvevents.SubscriberOptions{Retry: 20 * time.Millisecond})
	done := make(chan struct{})
	go func() { sub.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	chat := func(conv, turns int) map[string]any {
		msgs := []map[string]string{{"role": "system", "content": words(200)}}
		for i := range turns {
			msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("conversation %d turn %d: %s", conv, i, words(40+conv))})
		}
		return map[string]any{"model": testModel, "messages": msgs, "max_tokens": 8}
	}
	for conv := range 6 {
		for turns := 1; turns <= 3; turns++ {
			complete(t, url+"/v1/chat/completions", chat(conv, turns))
		}
	}
	if st := s.Stats(); st.EvictedBlocks == 0 {
		t.Fatalf("the run evicted nothing: the test needs a smaller cache")
	}
	waitFor(t, "the events to reach the store", func() bool {
		st, _ := store.Status(0)
		// Every batch published applied, and the engine has none left
		// to publish: the same blocks.
		return st == kvevents.Exact && store.Applied(0) == s.KVEventBatches() &&
			store.Blocks(0, kvevents.MediumGPU) == s.CachedBlocks()
	})

	// The last conversation is cached; its next turn's prompt, tokenized
	// by the server, matches as many blocks as the engine then reuses
	// (less the last block, which vLLM always recomputes).
	next := chat(5, 3)
	toks := tokenize(t, url, map[string]any{"model": testModel, "messages": next["messages"]})
	_, bs, gpu, _ := store.Match(0, func(bs int) []uint64 { return kvevents.TokenChain(nil, toks, bs) })
	if bs != cfg.Profile.BlockSize {
		t.Fatalf("block size %d from the events, want %d", bs, cfg.Profile.BlockSize)
	}
	r, _ := complete(t, url+"/v1/chat/completions", next)
	want := min(gpu, (len(toks)-1)/bs) * bs
	if got := r.Usage.PromptTokensDetails.CachedTokens; got != want || gpu == 0 {
		t.Fatalf("the events predicted %d cached blocks (%d tokens); the engine reported %d cached tokens", gpu, want, got)
	}

	// A restart: a new emulator on the same ports, its sequence from 0.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.KVEvents = &kvevents.PublisherConfig{Endpoint: endpoint, Replay: replay, Topic: "kv", Format: format}
	s2, url2 := startServer(t, cfg, nil)
	defer s2.Close()
	waitFor(t, "the restarted engine's state", func() bool {
		st, _ := store.Status(0)
		return st == kvevents.Exact && store.Blocks(0, kvevents.MediumGPU) == 0
	})
	complete(t, url2+"/v1/chat/completions", chat(0, 1))
	waitFor(t, "the restarted engine's blocks", func() bool {
		return store.Blocks(0, kvevents.MediumGPU) == s2.CachedBlocks() && s2.CachedBlocks() > 0
	})
}

func TestTokenize(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	msgs := []map[string]string{{"role": "user", "content": "hello there"}}
	chat := tokenize(t, url, map[string]any{"messages": msgs})
	bare := tokenize(t, url, map[string]any{"messages": msgs, "add_generation_prompt": false})
	if len(chat) <= len(bare) || fmt.Sprint(chat[:len(bare)]) != fmt.Sprint(bare) {
		t.Fatalf("the generation prompt should extend the conversation: %v vs %v", chat, bare)
	}
	text := tokenize(t, url, map[string]any{"prompt": "hello there"})
	plain := tokenize(t, url, map[string]any{"prompt": "hello there", "add_special_tokens": false})
	if len(text) != len(plain)+1 {
		t.Fatalf("add_special_tokens=false should drop BOS: %v vs %v", text, plain)
	}
	for _, bad := range []string{`{"model":"other","prompt":"x"}`, `{"messages":[]}`, `{}`, `[`} {
		resp, data := post(t, url+"/tokenize", bad)
		if resp.StatusCode/100 != 4 {
			t.Fatalf("%s: status %d: %s", bad, resp.StatusCode, data)
		}
		var e errorJSON
		if json.Unmarshal(data, &e) != nil || e.Error == nil {
			t.Fatalf("%s: not an OpenAI error: %s", bad, data)
		}
	}
}
