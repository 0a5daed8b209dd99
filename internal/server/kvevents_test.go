package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/kvevents/follow"
	"github.com/kvroute/kvroute/internal/router"
)

// eventingEmulator is an in-process emulator publishing its KV events on
// 127.0.0.1, behind an httptest server.
type eventingEmulator struct {
	srv         *emulator.Server
	url         string
	pub, replay string
}

func startEventingEmulators(t *testing.T, n int) []*eventingEmulator {
	t.Helper()
	p, err := engine.LookupProfile(engine.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	p.NumGPUBlocks = 400 // small enough to evict
	var out []*eventingEmulator
	for range n {
		s, err := emulator.New(emulator.Config{Model: "m", Profile: p, TimeScale: 0.01, Logger: testLogger(t),
			KVEvents: &kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", Topic: "kv"}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = s.Run(ctx); close(done) }()
		ts := httptest.NewServer(s)
		t.Cleanup(func() { ts.Close(); cancel(); <-done; s.Close() })
		e := &eventingEmulator{srv: s, url: ts.URL}
		e.pub, e.replay = s.KVEventsAddr()
		out = append(out, e)
	}
	return out
}

// TestKVEventsThroughTheServer runs kvroute serve's server over emulators
// that publish KV events: after conversations through the proxy, each
// backend's event state is exact and holds the engine's own count of
// cached blocks, and kvroute's decision for a next turn predicts the
// cached tokens the chosen backend then reports.
func TestKVEventsThroughTheServer(t *testing.T) {
	emus := startEventingEmulators(t, 3)
	var bs []*fleet.Backend
	endpoints := map[string]kvevents.Source{}
	for i, e := range emus {
		b, err := fleet.ParseBackend(i, fmt.Sprintf("gpu%d=%s", i, e.url))
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
		endpoints[b.Name] = kvevents.Source{Endpoint: e.pub, Replay: e.replay}
	}
	s, err := Start(context.Background(), Config{
		Backends: bs, Policy: "kvroute", Listen: "127.0.0.1:0", DrainDelay: -1, Grace: 5 * time.Second,
		Fleet:    fleet.Options{HealthInterval: 100 * time.Millisecond, ScrapeInterval: 200 * time.Millisecond, Timeout: time.Second},
		Logger:   testLogger(t),
		KVEvents: &follow.FollowConfig{Endpoints: endpoints, Topic: "kv", Retry: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)

	chat := func(conv, turns int) string {
		var msgs []string
		msgs = append(msgs, fmt.Sprintf(`{"role":"system","content":%q}`, strings.Repeat("You answer briefly. ", 40)))
		for i := range turns {
			msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":"conversation %d, question %d: %s"}`, conv, i, strings.Repeat("why is that so? ", 20+conv)))
		}
		return fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[%s]}`, strings.Join(msgs, ","))
	}
	post := func(body string) {
		res, err := http.Post(s.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("status %d: %s", res.StatusCode, data)
		}
	}
	for conv := range 8 {
		for turns := 1; turns <= 2; turns++ {
			post(chat(conv, turns))
		}
	}
	store := s.cfg.Router.KVRoute.Events.(*follow.Follower).Store()
	deadline := time.Now().Add(10 * time.Second)
	for i, e := range emus {
		for {
			st, _ := store.Status(i)
			if st == kvevents.Exact && store.Applied(i) == e.srv.KVEventBatches() && store.Blocks(i, kvevents.MediumGPU) == e.srv.CachedBlocks() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("backend %d: state %v with %d blocks; the engine holds %d", i, st, store.Blocks(i, kvevents.MediumGPU), e.srv.CachedBlocks())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// A next turn of the last conversation, routed by the server's own
	// router as the proxy does, then sent to the backend it chose.
	body := chat(7, 3)
	req := &router.Request{Model: "m", Prompt: body, Body: []byte(body), MaxTokens: 4}
	s.Router.Estimate(req)
	cands := s.Fleet.Candidates(nil, "m")
	tk, err := s.Router.Route(req, cands)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.Post(tk.Backend.URL.String()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	err = json.NewDecoder(res.Body).Decode(&out)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	tk.Finish(router.Outcome{Status: 200, PromptTokens: out.Usage.PromptTokens, CachedTokens: out.Usage.PromptTokensDetails.CachedTokens, CompletionTokens: 4})
	if got := out.Usage.PromptTokensDetails.CachedTokens; tk.Cached != got || got == 0 {
		t.Fatalf("kvroute predicted %d cached tokens on %s; it reported %d", tk.Cached, tk.Backend.Name, got)
	}
}
