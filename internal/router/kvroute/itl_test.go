package kvroute

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
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

// In a fleet where one backend decodes at half the others' pace (an older
// GPU beside newer ones), each backend's predicted time between tokens
// settles within 10 % of its own streams' (the decode fit is the fleet's,
// each backend's deviation from it a learned ratio beside it), and the
// slow backend, with no queue elsewhere to make up for its pace, gets few
// streams after its first. Eight streams at a time.
func TestPredictedITLPerBackend(t *testing.T) {
	slower := []float64{2, 1, 1, 1}
	bs := routertest.Backends(len(slower))
	now := time.Unix(1000, 0)
	r := newKVRouter(bs, Config{Seed: 1, Now: func() time.Time { return now }})
	truth := func(b, prompt, out int) float64 {
		return slower[b] * (0.021 + 0.03*(float64(prompt)+float64(out)/2)/100_000)
	}
	apes := make([][]float64, len(bs))
	served := make([]int, len(bs))
	type stream struct {
		tk          *router.Ticket
		prompt, out int
	}
	// stream routes request j among cands.
	stream1 := func(j int, cands []*fleet.Backend) stream {
		n := 400 + (j*7919)%40_000
		out := 50 + (j*31)%400
		req := &router.Request{Model: "m", Prompt: routertest.Words(1000+j, n), MaxTokens: out}
		return stream{routertest.Route(t, r, req, cands), req.PromptTokens, out}
	}
	finish := func(s stream) {
		b := s.tk.Backend.Index
		itl := truth(b, s.prompt, s.out)
		s.tk.FirstToken()
		s.tk.Finish(router.Outcome{Status: 200, PromptTokens: s.prompt, CachedTokens: s.tk.Cached,
			CompletionTokens: s.out, Tokens: s.out, TTFT: seconds(0.05), Latency: seconds(0.05 + float64(s.out-1)*itl)})
	}
	score := func(s stream) {
		itl := truth(s.tk.Backend.Index, s.prompt, s.out)
		apes[s.tk.Backend.Index] = append(apes[s.tk.Backend.Index], math.Abs(s.tk.PredictedITL.Seconds()-itl)/itl)
	}
	for i := 0; i < 1200; i += 8 {
		var batch []stream
		for j := i; j < i+8; j++ {
			batch = append(batch, stream1(j, bs))
		}
		for _, s := range batch {
			if i >= 600 {
				score(s)
			}
			served[s.tk.Backend.Index]++
			finish(s)
		}
		now = now.Add(time.Minute)
	}
	t.Logf("streams served by backend: %v", served)
	if slices.Min(served[1:]) < 4*served[0] {
		t.Errorf("streams served by backend: %v; want the slow one (0) to serve a quarter of any other's at most", served)
	}
	// The slow backend's predictions, asked of it alone.
	for j := 2000; j < 2050; j++ {
		s := stream1(j, bs[:1])
		score(s)
		finish(s)
		now = now.Add(time.Minute)
	}
	for b, a := range apes {
		slices.Sort(a)
		if med := a[len(a)/2]; med > 0.10 {
			t.Errorf("backend %d (%.0f× slower): median error of the predicted ITL %.3f over %d streams, want at most 0.10", b, slower[b], med, len(a))
		} else {
			t.Logf("backend %d (%.0f× slower): median error %.3f over %d streams", b, slower[b], med, len(a))
		}
	}
}
