package policies

import (
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/routertest"
)

// TestPoliciesFollowTheFleet grows every policy's fleet from 2 backends to 4
// (indexes past those it was built for) and shrinks it to the 2 new ones,
// routing concurrently throughout; run with -race. The new backends take
// requests, each is routable alone, and a removed backend's ticket finishes
// after it left.
func TestPoliciesFollowTheFleet(t *testing.T) {
	mk := func(i int) *fleet.Backend {
		u, _ := url.Parse(fmt.Sprintf("http://10.0.0.%d:8000", i))
		b := fleet.NewBackend(i, fmt.Sprintf("b%d", i), u)
		b.SetInfo(&fleet.Info{Models: []string{"m"}, BlockSize: 16, KVBlocks: 1000})
		return b
	}
	all := []*fleet.Backend{mk(0), mk(1), mk(2), mk(3)}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			r, err := New(name, all[:2], Options{Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			// A request in flight on b0 when it is removed.
			old := routertest.Route(t, r, &router.Request{Prompt: routertest.Words(0, 400), SessionKey: "old", MaxTokens: 10}, all[:2])

			var mu sync.Mutex
			cands := all[:2]
			seen := map[string]int{}
			var wg sync.WaitGroup
			stop := make(chan struct{})
			for g := range 4 {
				wg.Go(func() {
					// Each goroutine keeps 8 requests open, so that there is
					// load to spread onto the new backends.
					var open []*router.Ticket
					defer func() {
						for _, tk := range open {
							tk.Finish(router.Failed(499))
						}
					}()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						mu.Lock()
						cs := cands
						mu.Unlock()
						req := &router.Request{Prompt: routertest.Words(g*100_000+i, 300+i%5*100), SessionKey: fmt.Sprintf("s%d-%d", g, i), MaxTokens: 10}
						tk, err := r.Route(req, cs)
						if err != nil {
							t.Error(err)
							return
						}
						tk.FirstToken()
						open = append(open, tk)
						if len(open) < 8 {
							continue
						}
						tk, open = open[0], open[1:]
						tk.Finish(router.Outcome{Status: 200, PromptTokens: 100, CachedTokens: 50, CompletionTokens: 10,
							TTFT: 20 * time.Millisecond, Latency: 100 * time.Millisecond})
						mu.Lock()
						seen[tk.Backend.Name]++
						mu.Unlock()
					}
				})
			}
			// As the fleet does: tell the policy first, then offer the
			// new candidates.
			step := func(bs []*fleet.Backend) {
				r.SetBackends(bs)
				mu.Lock()
				cands = bs
				clear(seen)
				mu.Unlock()
				// Routes on the new set before the next step.
				for {
					mu.Lock()
					n := 0
					for _, c := range seen {
						n += c
					}
					mu.Unlock()
					if n >= 200 {
						return
					}
					time.Sleep(time.Millisecond)
				}
			}
			step(all)
			mu.Lock()
			if seen["b2"]+seen["b3"] == 0 {
				t.Errorf("the new backends took none of %v after the fleet grew", seen)
			}
			mu.Unlock()
			step(all[2:])
			close(stop)
			wg.Wait()
			old.Finish(router.Outcome{Status: 200, PromptTokens: 100, CachedTokens: 0, TTFT: time.Second, Latency: 2 * time.Second})
			// Each new backend is routable on its own.
			for _, b := range all[2:] {
				d := routertest.Route(t, r, &router.Request{Prompt: routertest.Words(9, 500), SessionKey: "x", MaxTokens: 10}, []*fleet.Backend{b})
				if d.Backend != b {
					t.Errorf("picked %v among only %s", d.Backend, b.Name)
				}
				d.Finish(router.Failed(499))
			}
		})
	}
}
