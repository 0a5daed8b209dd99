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
	"github.com/kvroute/kvroute/internal/router/policies"
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

// routeAndSend routes body with the server's own router, as the proxy
// does, sends it to the chosen backend and finishes the ticket; it returns
// the predicted and the reported cached tokens.
func routeAndSend(t *testing.T, s *Server, body string) (predicted, reported int) {
	t.Helper()
	req := &router.Request{Model: "m", Prompt: body, Body: []byte(body), MaxTokens: 4}
	s.Router.Estimate(req)
	tk, err := s.Router.Route(req, s.Fleet.Candidates(nil, "m"))
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
	got := out.Usage.PromptTokensDetails.CachedTokens
	tk.Finish(router.Outcome{Status: 200, PromptTokens: out.Usage.PromptTokens, CachedTokens: got, CompletionTokens: 4})
	return tk.Cached, got
}

// patientTokenizer waits for /tokenize as long as it takes. These tests
// measure the matching, not its latency: with the default 50 ms a CI
// machine under load (and the race detector) let some calls time out, and
// the index, not the events, decided those requests.
func patientTokenizer() *follow.Tokenizer { return follow.NewTokenizer(nil, 10*time.Second, 0) }

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
		KVEvents: &follow.FollowConfig{Endpoints: endpoints, Topic: "kv", Retry: 50 * time.Millisecond, Tokenizer: patientTokenizer()},
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
	store := s.Events.Store()
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
	if predicted, got := routeAndSend(t, s, chat(7, 3)); predicted != got || got == 0 {
		t.Fatalf("kvroute predicted %d cached tokens; the backend reported %d", predicted, got)
	}
}

// TestKVEventsLivePrediction plays the same conversations, one request at
// a time, through two routers over two fresh fleets of emulators over real
// sockets, one following the engines' KV events and one not, and measures
// the share of requests whose predicted cached tokens were right to the
// block (16 tokens).
func TestKVEventsLivePrediction(t *testing.T) {
	accuracy := func(events bool) float64 {
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
		cfg := Config{Backends: bs, Policy: "kvroute", Listen: "127.0.0.1:0", DrainDelay: -1, Grace: 5 * time.Second,
			Fleet:  fleet.Options{HealthInterval: 100 * time.Millisecond, ScrapeInterval: 200 * time.Millisecond, Timeout: time.Second},
			Logger: testLogger(t), Router: policies.Options{Seed: 1}}
		if events {
			cfg.KVEvents = &follow.FollowConfig{Endpoints: endpoints, Topic: "kv", Retry: 50 * time.Millisecond, Tokenizer: patientTokenizer()}
		}
		s, err := Start(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		right, n := 0, 0
		for turn := 1; turn <= 4; turn++ {
			for conv := range 10 {
				var msgs []string
				msgs = append(msgs, fmt.Sprintf(`{"role":"system","content":"%d %s"}`, conv%3, strings.Repeat("Answer briefly and well. ", 30)))
				for i := range turn {
					msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":"conversation %d, question %d: %s"}`, conv, i, strings.Repeat("and why? ", 15+conv)))
				}
				body := fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[%s]}`, strings.Join(msgs, ","))
				if events {
					waitCaughtUp(t, s, emus)
				}
				predicted, got := routeAndSend(t, s, body)
				n++
				if predicted/16 == got/16 {
					right++
				}
			}
		}
		return float64(right) / float64(n)
	}
	without, with := accuracy(false), accuracy(true)
	t.Logf("predicted to the block, live: %.1f %% with events, %.1f %% without", 100*with, 100*without)
	if with < 0.99 || with <= without {
		t.Fatalf("predicted to the block: %.3f with events, %.3f without; want ≥ 0.99 and better", with, without)
	}
}

// waitCaughtUp waits until the router has applied every batch the
// emulators published: what a request one at a time sees in a fleet whose
// events arrive in under a millisecond.
func waitCaughtUp(t *testing.T, s *Server, emus []*eventingEmulator) {
	t.Helper()
	store := s.Events.Store()
	deadline := time.Now().Add(10 * time.Second)
	for i, e := range emus {
		for store.Applied(i) != e.srv.KVEventBatches() || store.Blocks(i, kvevents.MediumGPU) != e.srv.CachedBlocks() {
			if time.Now().After(deadline) {
				t.Fatalf("backend %d: the events did not arrive", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
}
