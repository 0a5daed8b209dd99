package sim

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/workload"
)

// mixedFleet parses a --profile fleet spec into each server's profile.
func mixedFleet(t testing.TB, spec string) []engine.Profile {
	t.Helper()
	parts, err := engine.ParseFleet(spec)
	if err != nil {
		t.Fatal(err)
	}
	return engine.FleetServers(parts, 0)
}

// kindShare is the share of prompt tokens the servers of kind took.
func kindShare(t *testing.T, cfg Config, run *results.Run, kind string) float64 {
	t.Helper()
	for _, k := range Kinds(cfg, run) {
		if k.Kind == kind {
			return k.PromptTokens
		}
	}
	t.Fatalf("%s: no servers of kind %s", run.Policy, kind)
	return 0
}

// On two H100s and two A100s, told nothing of which is which, kvroute
// learns the A100s' slower prefill and decode from their first tokens and
// streams: it gives the H100s more of the prompt tokens than least-request
// does (which sees only the requests in flight) and its TTFT p99 is lower.
func TestMixedGPUsLearnedSpeeds(t *testing.T) {
	servers := mixedFleet(t, "h100-llama3-8b:2,a100-llama3-8b:2")
	cfg := Config{Workload: chatWorkload(t, 120), Backends: 4, Profile: servers[0], Servers: servers,
		Policies: []string{"kvroute", "least-request"}, Seed: 3}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	kv, lr := &rep.Runs[0], &rep.Runs[1]
	for _, run := range rep.Runs {
		t.Logf("%s: H100 share of prompt tokens %.1f %%, TTFT p99 %v, hit rate %.1f %%", run.Policy,
			100*kindShare(t, cfg, &run, "h100-llama3-8b"), run.Summary.TTFTP99, 100*run.Summary.HitRate)
		if run.Summary.Errors != 0 {
			t.Errorf("%s: %d errors", run.Policy, run.Summary.Errors)
		}
	}
	if a, b := kindShare(t, cfg, kv, "h100-llama3-8b"), kindShare(t, cfg, lr, "h100-llama3-8b"); a < b+0.10 {
		t.Errorf("kvroute gave the H100s %.1f %% of the prompt tokens, least-request %.1f %%: want 10 points more", 100*a, 100*b)
	}
	if kv.Summary.TTFTP99 >= lr.Summary.TTFTP99 {
		t.Errorf("TTFT p99 kvroute %v, least-request %v: want kvroute's lower", kv.Summary.TTFTP99, lr.Summary.TTFTP99)
	}

	// The same traffic on four H100s: kvroute splits the prompt tokens
	// about evenly between the first two servers and the last two, so the
	// share above is the GPUs', not the order of the servers.
	cfg.Servers, cfg.Policies = nil, []string{"kvroute"}
	rep, err = Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var first, all float64
	for i, b := range rep.Runs[0].Backends {
		all += float64(b.PromptTokens)
		if i < 2 {
			first += float64(b.PromptTokens)
		}
	}
	t.Logf("four H100s: the first two took %.1f %% of the prompt tokens", 100*first/all)
	if share := first / all; share < 0.35 || share > 0.65 {
		t.Errorf("four H100s: the first two took %.1f %% of the prompt tokens: want 35–65 %%", 100*share)
	}
}

// A fleet of three models, one of them on only two servers: every request
// is routed among the servers serving its model, and each model's servers
// get its traffic.
func TestThreeModelsRoutedToTheirServers(t *testing.T) {
	servers := mixedFleet(t, "h100-llama3-8b:4,4xh100-llama3-70b:2,h100-llama3-8b=llama-3.1-8b-code:2")
	w := chatWorkload(t, 90)
	if err := workload.AssignModels(&w, []string{servers[0].Model, servers[4].Model, servers[6].Model}, []float64{4, 2, 2}, 1); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Workload: w, Backends: 8, Profile: servers[0], Servers: servers,
		Policies: []string{"kvroute", "round-robin"}, Seed: 1}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range rep.Runs {
		if run.Summary.Errors != 0 || run.Summary.Requests != 540 {
			t.Errorf("%s: %d requests, %d errors; want 540, none", run.Policy, run.Summary.Requests, run.Summary.Errors)
		}
		per := make([]int, len(servers))
		for _, r := range run.Requests {
			i, ok := serverIndex(r.Backend)
			if !ok {
				t.Fatalf("%s: backend %q", run.Policy, r.Backend)
			}
			if want := w.Sessions[r.Session].Model; servers[i].Model != want {
				t.Fatalf("%s: a request for %s went to %s, which serves %s", run.Policy, want, r.Backend, servers[i].Model)
			}
			per[i]++
		}
		for i, n := range per {
			if n == 0 {
				t.Errorf("%s: server %d (%s) served nothing", run.Policy, i, servers[i].Model)
			}
		}
	}
	// A session asking for a model no server serves is a configuration
	// error, not a run of failures.
	w.Sessions[0].Model = "nobody-serves-this"
	if _, err := Run(context.Background(), Config{Workload: w, Backends: 8, Profile: servers[0], Servers: servers, Policies: []string{"kvroute"}}); err == nil {
		t.Error("a session for a model no server serves: no error")
	}
}
