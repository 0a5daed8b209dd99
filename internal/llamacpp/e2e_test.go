package llamacpp

import (
	"context"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/workload"
)

// startFleet starts n llama-servers with the default model (written on
// first use) and returns their URLs; they are killed when the test ends.
func startFleet(t *testing.T, n int) []string {
	t.Helper()
	in := Require(t)
	model, err := in.Model(DefaultModel())
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for range n {
		s, err := in.Start(t.Context(), ServerConfig{Model: model, Context: 16384, Slots: 4, Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("%s log:\n%s", s.URL, s.Log())
			}
			s.Close()
		})
		urls = append(urls, s.URL)
	}
	return urls
}

// smallChat is a few conversations under two shared system prompts, sized
// to take seconds on llama-servers of one thread each.
func smallChat(sessions, turns int, seed uint64) []workload.Session {
	return workload.Chat(workload.ChatConfig{
		Sessions: sessions, Span: 2 * time.Second, Turns: turns,
		SystemPrompts: 2, SystemBytes: 1600, UserBytes: 200,
		LightTokens: 8, HeavyTokens: 8, Think: 300 * time.Millisecond,
	}, seed)
}

// One real fleet of three llama-servers for every check below: starting it
// (loading the model three times) is the slow part.
func TestLlamaServerFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real llama-servers")
	}
	urls := startFleet(t, 3)

	t.Run("conversations hit the cache through kvroute", func(t *testing.T) {
		f, err := bench.StartFleet(t.Context(), bench.FleetConfig{BackendURLs: urls, Policy: "kvroute", Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		c := &bench.Client{BaseURL: f.URL, Model: f.Model, IgnoreEOS: true, Tag: "[e2e conversations] "}
		results := c.Run(t.Context(), smallChat(3, 3, 1), nil)
		if len(results) != 9 {
			t.Fatalf("%d results, want 9", len(results))
		}
		first := map[int]string{}
		for _, r := range results {
			if r.Err != nil {
				t.Fatalf("session %d turn %d: %v", r.Session, r.Turn, r.Err)
			}
			if r.Turn == 0 {
				first[r.Session] = r.Backend
			}
			if r.CompletionTokens != 8 {
				t.Errorf("session %d turn %d: %d completion tokens, want 8 (ignore_eos)", r.Session, r.Turn, r.CompletionTokens)
			}
		}
		for _, r := range results {
			if r.Turn == 0 {
				continue
			}
			if r.Backend != first[r.Session] {
				t.Errorf("session %d turn %d went to %s, turn 0 to %s", r.Session, r.Turn, r.Backend, first[r.Session])
			}
			// Everything before the new user message was computed by
			// the previous turn on that server.
			if r.CachedTokens == 0 || r.CachedTokens < r.PromptTokens/2 {
				t.Errorf("session %d turn %d: %d of %d prompt tokens cached", r.Session, r.Turn, r.CachedTokens, r.PromptTokens)
			}
			if r.ServerTTFT <= 0 {
				t.Errorf("session %d turn %d: no timings.prompt_ms from llama-server", r.Session, r.Turn)
			}
		}
	})

	t.Run("kvroute hits the cache more than round-robin", func(t *testing.T) {
		rep, err := bench.RunBench(t.Context(), bench.Config{
			Workload:    workload.Workload{Name: "e2e", Sessions: smallChat(6, 3, 2)},
			BackendURLs: urls,
			Policies:    []string{"kvroute", "round-robin"},
			Seed:        1,
		})
		if err != nil {
			t.Fatal(err)
		}
		kv, rr := rep.Runs[0].Summary, rep.Runs[1].Summary
		for _, run := range rep.Runs {
			for _, r := range run.Requests {
				if r.Error != "" || r.Status != 200 {
					t.Logf("%s: session %d turn %d on %s: status %d: %s", run.Policy, r.Session, r.Turn, r.Backend, r.Status, r.Error)
				}
			}
		}
		for _, s := range []results.Summary{kv, rr} {
			if s.Errors > 0 || s.Requests != 18 {
				t.Fatalf("%s: %d requests, %d errors", s.Name, s.Requests, s.Errors)
			}
			t.Logf("%-12s hit rate %5.1f %%, prefill %6d tokens, TTFT p50 %v p99 %v", s.Name, 100*s.HitRate,
				s.PromptTokens-s.CachedTokens, s.TTFTP50.Round(time.Millisecond), s.TTFTP99.Round(time.Millisecond))
		}
		if kv.HitRate <= rr.HitRate {
			t.Errorf("kvroute hit rate %.3f, round-robin %.3f: want kvroute higher", kv.HitRate, rr.HitRate)
		}
		// The servers' own counters agree with what the responses said.
		for _, run := range rep.Runs {
			var cached int64
			for _, b := range run.Backends {
				cached += b.CachedTokens
			}
			if cached != int64(run.Summary.CachedTokens) {
				t.Errorf("%s: llamacpp:prompt_tokens_cached_total grew by %d, responses reported %d cached",
					run.Policy, cached, run.Summary.CachedTokens)
			}
		}
	})

	t.Run("metrics and slots are understood", func(t *testing.T) {
		var backends []*fleet.Backend
		for i, raw := range urls {
			u, _ := url.Parse(raw)
			backends = append(backends, fleet.NewBackend(i, u.Host, u))
		}
		fl := fleet.New(backends, fleet.Options{Timeout: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		fl.Refresh(ctx)
		for _, b := range backends {
			m := fl.Metrics(b)
			if m == nil || !b.Info().Serves("random-llama") {
				t.Fatalf("%s: metrics %+v, info %+v", b.Name, m, b.Info())
			}
			if m.Slots != 4 || m.SlotContext != 4096 || m.KVUsage < 0 {
				t.Errorf("%s: %d slots of %d tokens, KV usage %v; want 4 of 4096 and a usage", b.Name, m.Slots, m.SlotContext, m.KVUsage)
			}
			if m.PrefixQueries <= 0 || m.PrefixHits <= 0 || m.BusySeconds <= 0 {
				t.Errorf("%s: prompt tokens %v, cached %v, busy %v s: want all positive after the runs", b.Name, m.PrefixQueries, m.PrefixHits, m.BusySeconds)
			}
		}
	})
}
