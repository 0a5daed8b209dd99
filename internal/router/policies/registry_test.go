package policies

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/kvroute"
	"github.com/kvroute/kvroute/internal/router/llmrouters"
	"github.com/kvroute/kvroute/internal/router/routertest"
)

func TestWithObjective(t *testing.T) {
	for _, tt := range []struct {
		name, want string
		obj        kvroute.Objective
		wantErr    bool
	}{
		{"kvroute", "kvroute", "", false},
		{"kvroute:e2e", "kvroute", kvroute.ObjectiveE2E, false},
		{"kvroute:goodput", "kvroute", kvroute.ObjectiveGoodput, false},
		{"kvroute:fast", "", "", true},
		{"round-robin:e2e", "", "", true},
	} {
		var opts Options
		got, err := withObjective(tt.name, &opts)
		if (err != nil) != tt.wantErr || !tt.wantErr && (got != tt.want || opts.KVRoute.Objective != tt.obj) {
			t.Errorf("%s: %q, %q, %v; want %q, %q, error %v", tt.name, got, opts.KVRoute.Objective, err, tt.want, tt.obj, tt.wantErr)
		}
	}
}

func TestNewBuildsEveryPolicy(t *testing.T) {
	peers := map[string]bool{"random": true, "p2c": true, "session-bounded": true,
		"sglang-cache-aware": true, "dynamo-kv": true, "llmd-default": true, "llmd-lora": true, "preble-e2": true}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			// Flag validation builds policies without a fleet.
			if _, err := New(name, nil, Options{}); err != nil {
				t.Fatalf("New without backends: %v", err)
			}
			bs := routertest.Backends(3)
			p, err := New(name, bs, Options{Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			if p.Name() != name {
				t.Errorf("Name() = %q", p.Name())
			}
			req := &router.Request{Prompt: routertest.Words(1, 2000), SessionKey: "s", MaxTokens: 50}
			d := routertest.Route(t, p, req, bs)
			if d.Backend == nil || d.Reason == "" {
				t.Errorf("decision %+v: want a backend and a reason", d.Decision)
			}
			// Every policy's request is counted where it went: its estimated
			// prompt and its output.
			if l := d.Backend.Load(); req.PromptTokens != 500 || l.Requests != 1 || l.DecodeTokens != 550 {
				t.Errorf("%d prompt tokens estimated, load %+v: want 500, 1 request of 550 tokens", req.PromptTokens, l)
			}
			d.Finish(router.Failed(499))
			if l := d.Backend.Load(); l != (fleet.Load{}) {
				t.Errorf("load %+v left after the ticket finished", l)
			}
			if _, err := p.Route(&router.Request{}, nil); !errors.Is(err, router.ErrNoBackend) {
				t.Errorf("no candidates: err = %v, want ErrNoBackend", err)
			}
			if peers[name] {
				// Backends the policy was not built for (added later) are
				// routed to, not a panic.
				q, _ := New(name, nil, Options{Seed: 1})
				for range 3 {
					routertest.Pick(t, q.Policy(), &router.Request{Prompt: routertest.Words(2, 3000), SessionKey: "s"}, bs)
				}
			}
		})
	}
	if _, err := New("nope", nil, Options{}); err == nil {
		t.Error("an unknown policy was accepted")
	}
}

// TestPeersConcurrentPicks runs every peer from many goroutines, for the race
// detector.
func TestPeersConcurrentPicks(t *testing.T) {
	scraped := &fleet.Metrics{Waiting: 1, KVUsage: 0.3}
	for _, name := range []string{"random", "p2c", "session-bounded", "sglang-cache-aware", "dynamo-kv", "llmd-default", "llmd-lora", "preble-e2"} {
		t.Run(name, func(t *testing.T) {
			bs := routertest.Backends(4)
			p, err := New(name, bs, Options{Seed: 1, Metrics: func(b *fleet.Backend) *fleet.Metrics {
				if b.Index%2 == 0 {
					return scraped
				}
				return nil
			}, Peers: llmrouters.Config{SGLang: llmrouters.SGLangConfig{MaxTreeChars: 20_000}}})
			if err != nil {
				t.Fatal(err)
			}
			system := routertest.Words(0, 2000)
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					for i := range 50 {
						req := &router.Request{Prompt: system + routertest.Words(g*100+i, 1000), SessionKey: fmt.Sprint(g), MaxTokens: 10}
						d, err := p.Route(req, bs)
						if err != nil {
							t.Error(err)
							return
						}
						d.FirstToken()
						d.Finish(router.Failed(499))
					}
				})
			}
			wg.Wait()
		})
	}
}

// Deterministic given a seed: the same requests give the same decisions.
func TestPeersAreDeterministic(t *testing.T) {
	for _, name := range []string{"random", "p2c", "session-bounded", "sglang-cache-aware", "dynamo-kv", "llmd-default", "llmd-lora", "preble-e2"} {
		run := func() uint64 {
			bs := routertest.Backends(5)
			p, _ := New(name, bs, Options{Seed: 7})
			h := xxhash.New()
			var flights []*router.Ticket
			for i := range 200 {
				d := routertest.Route(t, p, &router.Request{Prompt: routertest.Words(i%9, 800+i), SessionKey: fmt.Sprint(i % 4)}, bs)
				fmt.Fprintln(h, d.Backend.Name, d.Reason)
				flights = append(flights, d)
				if i%2 == 0 {
					flights[0].Finish(router.Failed(499))
					flights = flights[1:]
				}
			}
			return h.Sum64()
		}
		if a, b := run(), run(); a != b {
			t.Errorf("%s: two runs with seed 7 differ", name)
		}
	}
}
