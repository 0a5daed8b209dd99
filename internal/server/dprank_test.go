package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/upstream"
)

// kvroute in front of one emulated server of two data-parallel ranks,
// routed to as two backends: each request lands on the rank it was routed
// to (the rank header reaches the server), and a conversation's second
// turn goes back to its rank and hits the cache there.
func TestDataParallelRanksThroughTheRouter(t *testing.T) {
	dp, err := emulator.NewDataParallel(emulator.Config{TimeScale: 0.01, Seed: 1, Logger: testLogger(t)}, 2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dp.Run(ctx) }()
	ts := httptest.NewServer(dp)
	t.Cleanup(func() { cancel(); <-done; ts.Close() })

	b, err := fleet.ParseBackend(0, "gpu0="+ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	ranks, err := fleet.ExpandRanks(b, 2)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(context.Background(), Config{
		Backends: ranks, Policy: "kvroute", Listen: "127.0.0.1:0", DrainDelay: -1, Grace: 5 * time.Second,
		Fleet:  fleet.Options{HealthInterval: 100 * time.Millisecond, ScrapeInterval: 200 * time.Millisecond, Timeout: patience},
		Proxy:  proxy.Config{Transport: upstream.NewTransport()},
		Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)

	model := dp.Rank(0).Model()
	msgs := []map[string]string{{"role": "user", "content": strings.Repeat("tell me about ranks ", 200)}}
	send := func() (backend string, cached int) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "max_tokens": 8})
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/chat/completions", strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Session-ID", "conversation-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, data)
		}
		var out struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(data, &out); err != nil || len(out.Choices) != 1 {
			t.Fatalf("decode %s: %v", data, err)
		}
		msgs = append(msgs, map[string]string{"role": "assistant", "content": out.Choices[0].Message.Content},
			map[string]string{"role": "user", "content": "and then?"})
		return resp.Header.Get("X-Kvroute-Backend"), out.Usage.Details.Cached
	}
	first, _ := send()
	rank := map[string]int{"gpu0/dp0": 0, "gpu0/dp1": 1}
	r, ok := rank[first]
	if !ok {
		t.Fatalf("routed to %q, not a rank", first)
	}
	if got := dp.Rank(r).Stats().Finished; got != 1 {
		t.Fatalf("rank %d served %d requests after the first, want 1 (the header did not reach it)", r, got)
	}
	second, cached := send()
	if second != first || cached == 0 {
		t.Errorf("second turn on %s with %d cached tokens, want %s with its conversation cached", second, cached, first)
	}
	if got := dp.Rank(1 - r).Stats().Finished; got != 0 {
		t.Errorf("the other rank served %d requests", got)
	}
}
