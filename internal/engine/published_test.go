package engine

import (
	"fmt"
	"testing"
	"time"
)

// batchLatency runs n identical requests that arrive together on a fresh
// engine and returns the mean end-to-end latency, the mean TTFT and the mean
// time per output token after the first.
func batchLatency(t testing.TB, p Profile, n, in, out int) (e2e, ttft, tpot time.Duration) {
	t.Helper()
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]*Request, n)
	for i := range reqs {
		// Distinct prompts: the published runs did not reuse a prefix.
		reqs[i] = newReq(uint64(i+1), p.BlockSize, seq(i*1_000_000, in), out)
		mustAdd(t, e, 0, reqs[i])
	}
	drain(t, e, 0)
	for _, r := range reqs {
		e2e += r.Finish - r.Arrival
		ttft += r.FirstToken - r.Arrival
		if out > 1 {
			tpot += (r.Finish - r.FirstToken) / time.Duration(out-1)
		}
	}
	d := time.Duration(n)
	return e2e / d, ttft / d, tpot / d
}

// TestPublishedFigures compares the profiles with published vLLM
// measurements (sources in docs/engine-model.md). Each row is a run whose
// conditions the source states; the model must land within the tolerance.
func TestPublishedFigures(t *testing.T) {
	tests := []struct {
		name        string
		profile     string
		n, in, out  int
		metric      string
		published   time.Duration
		tolerance   float64
		description string
	}{
		{"ci-latency-8b", "h100-llama3-8b", 8, 32, 128, "e2e", 997500 * time.Microsecond, 0.15,
			"vLLM CI latency_llama8B_tp1: batch 8, 32 in, 128 out, mean latency"},
		{"ci-latency-70b", "4xh100-llama3-70b", 8, 32, 128, "e2e", 2444500 * time.Microsecond, 0.15,
			"vLLM CI latency_llama70B_tp4: batch 8, 32 in, 128 out, mean latency"},
		{"lambda-10-prompts", "h100-llama3-8b", 10, 200, 200, "tpot", 7560 * time.Microsecond, 0.15,
			"Lambda vllm-benchmark, 10 ShareGPT prompts at once: median TPOT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := LookupProfile(tt.profile)
			if err != nil {
				t.Fatal(err)
			}
			e2e, ttft, tpot := batchLatency(t, p, tt.n, tt.in, tt.out)
			got := map[string]time.Duration{"e2e": e2e, "ttft": ttft, "tpot": tpot}[tt.metric]
			ratio := float64(got) / float64(tt.published)
			t.Logf("%s: model %v, published %v (%.2f×)", tt.description, got.Round(100*time.Microsecond), tt.published, ratio)
			if ratio < 1-tt.tolerance || ratio > 1+tt.tolerance {
				t.Errorf("%s: model %v is %.2f× the published %v", tt.metric, got, ratio, tt.published)
			}
		})
	}
}

// TestPrintLatencyTable prints the model's TTFT for a lone request by prompt
// length and its decode step time by batch size and context, the tables of
// docs/engine-model.md (go test ./internal/engine -run LatencyTable -v), and
// checks that both grow with the work.
func TestPrintLatencyTable(t *testing.T) {
	for _, name := range ProfileNames() {
		p, err := LookupProfile(name)
		if err != nil {
			t.Fatal(err)
		}
		line := name + " TTFT:"
		var last time.Duration
		for _, in := range []int{128, 1024, 2048, 8192, 32768, 100_000} {
			if in >= p.MaxModelLen {
				break // longer than the profile's context (a llama.cpp slot's)
			}
			_, ttft, _ := batchLatency(t, p, 1, in, 1)
			line += fmt.Sprintf(" %d→%v", in, ttft.Round(100*time.Microsecond))
			if ttft <= last {
				t.Errorf("%s: TTFT of %d tokens (%v) not above the shorter prompt's (%v)", name, in, ttft, last)
			}
			last = ttft
		}
		t.Log(line)
		for _, ctx := range []int{1000, 8000} {
			last = 0
			line = fmt.Sprintf("%s decode step (%d context):", name, ctx)
			for _, n := range []int{1, 8, 32, 64, 128, 256} {
				if n*ctx > p.Blocks()*p.BlockSize {
					break // more context than the KV cache holds
				}
				var w Work
				for range n {
					w.AddChunk(ctx-1, ctx)
				}
				step := p.StepTime(w)
				line += fmt.Sprintf(" %d→%v", n, step.Round(10*time.Microsecond))
				if step <= last {
					t.Errorf("%s: a decode step of %d sequences (%v) not above a smaller batch's (%v)", name, n, step, last)
				}
				last = step
			}
			t.Log(line)
		}
	}
}
