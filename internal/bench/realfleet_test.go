package bench

import (
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"testing"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// runningEmulators starts n emulators as stand-alone servers, as a real
// fleet would be: the bench only knows their URLs.
func runningEmulators(t *testing.T, n int) []string {
	t.Helper()
	p, err := engine.LookupProfile(engine.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for range n {
		s, err := emulator.New(emulator.Config{Profile: p, TimeScale: 0.01, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		go s.Run(t.Context())
		hs := httptest.NewServer(s)
		t.Cleanup(hs.Close)
		urls = append(urls, hs.URL)
	}
	return urls
}

// The same policy twice on the same running servers: the second run starts
// from a cold cache all the same (its prompts carry their own tag), and the
// per-backend totals come from the servers' metrics.
func TestRunBenchOnRunningServers(t *testing.T) {
	urls := runningEmulators(t, 2)
	rng := rand.New(rand.NewPCG(5, 6))
	var sessions []workload.Session
	for i := range 4 {
		s := workload.Session{ID: fmt.Sprintf("s%d", i), System: workload.Text(rng, 2000)}
		for range 2 {
			s.Turns = append(s.Turns, workload.Turn{User: workload.Text(rng, 200), MaxTokens: 8})
		}
		sessions = append(sessions, s)
	}
	rep, err := RunBench(t.Context(), Config{
		Workload:    workload.Workload{Name: "test", Sessions: sessions},
		BackendURLs: urls,
		Policies:    []string{"kvroute", "kvroute"},
		Seed:        1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Backends != 2 || rep.TimeScale != 1 || rep.Bounds.Ideal != 0 || rep.Bounds.Unlimited <= 0 {
		t.Errorf("report: %d backends, time scale %v, bounds %+v; want 2, 1, no ideal bound, an unlimited one",
			rep.Backends, rep.TimeScale, rep.Bounds)
	}
	for i, run := range rep.Runs {
		var prompt, cached int64
		for _, b := range run.Backends {
			prompt += b.PromptTokens
			cached += b.CachedTokens
		}
		s := run.Summary
		if s.Errors != 0 || s.Requests != 8 {
			t.Fatalf("run %d: %d requests, %d errors", i, s.Requests, s.Errors)
		}
		if prompt != int64(s.PromptTokens) || cached != int64(s.CachedTokens) {
			t.Errorf("run %d: backends counted %d prompt, %d cached tokens; responses said %d, %d",
				i, prompt, cached, s.PromptTokens, s.CachedTokens)
		}
		for _, r := range run.Requests {
			// The tag itself is shared within a run: one block of it may hit.
			if r.Turn == 0 && r.CachedTokens > 16 {
				t.Errorf("run %d session %d: first turn found %d tokens cached: an earlier run's cache leaked in", i, r.Session, r.CachedTokens)
			}
			if r.Turn == 1 && r.CachedTokens == 0 {
				t.Errorf("run %d session %d: second turn missed the cache", i, r.Session)
			}
		}
	}
}

func TestRunBenchBadBackendURL(t *testing.T) {
	for _, u := range []string{"localhost:1", "ftp://x", "http://127.0.0.1:1"} {
		_, err := RunBench(t.Context(), Config{
			Workload:    workload.Workload{Sessions: []workload.Session{{Turns: []workload.Turn{{User: "hi"}}}}},
			BackendURLs: []string{u},
			Policies:    []string{"round-robin"},
		})
		if err == nil {
			t.Errorf("%s: no error", u)
		}
	}
}
