package kvroute

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/routertest"
)

// On an engine whose steps take three times the H100 prior and grow with
// the context, the predicted time between tokens the decision reports
// settles within 10 % of the streams' after a few hundred of them, and the
// router scores it; under the TTFT objective nothing is predicted.
func TestPredictedITLLearnsTheEngine(t *testing.T) {
	truth := func(kv float64) float64 { return 0.021 + 0.03*kv/100_000 }
	for _, obj := range []Objective{ObjectiveE2E, ObjectiveTTFT} {
		t.Run(string(obj), func(t *testing.T) {
			bs := routertest.Backends(4)
			now := time.Unix(1000, 0)
			r := newKVRouter(bs, Config{Seed: 1, Objective: obj, Now: func() time.Time { return now }})
			var apes []float64
			for i := range 500 {
				n := 400 + (i*7919)%40_000
				out := 50 + (i*31)%400
				req := &router.Request{Model: "m", Prompt: routertest.Words(1000+i, n), MaxTokens: out}
				tk := routertest.Route(t, r, req, bs)
				if obj == ObjectiveTTFT {
					if tk.PredictedITL != 0 {
						t.Fatalf("predicted ITL %v under the TTFT objective, want none", tk.PredictedITL)
					}
				} else if tk.PredictedITL <= 0 {
					t.Fatalf("request %d: no predicted ITL under the e2e objective", i)
				}
				// One stream at a time: its context is its prompt and half its reply.
				itl := truth(float64(req.PromptTokens) + float64(out)/2)
				if i >= 300 && obj != ObjectiveTTFT {
					apes = append(apes, math.Abs(tk.PredictedITL.Seconds()-itl)/itl)
				}
				ttft := 0.05
				tk.FirstToken()
				tk.Finish(router.Outcome{Status: 200, PromptTokens: req.PromptTokens, CachedTokens: tk.Cached,
					CompletionTokens: out, Tokens: out, TTFT: seconds(ttft), Latency: seconds(ttft + float64(out-1)*itl)})
				now = now.Add(time.Minute) // one at a time: no queue, no prefill sharing the steps
			}
			got := r.AccuracyITL().Fleet
			if obj == ObjectiveTTFT {
				if got.Count != 0 {
					t.Errorf("ITL predictions scored: %d, want none", got.Count)
				}
				return
			}
			slices.Sort(apes)
			if med := apes[len(apes)/2]; med > 0.10 {
				t.Errorf("median error of the predicted ITL over requests 300-500: %.3f, want at most 0.10", med)
			} else {
				t.Logf("median error over requests 300-500: %.3f", med)
			}
			if got.Count != 500 || got.Scored != 300 || !math.IsNaN(got.Coverage) {
				t.Errorf("router's ITL score: %d recorded, %d scored, coverage %v; want 500, 300 and none (no interval)", got.Count, got.Scored, got.Coverage)
			}
		})
	}
}
