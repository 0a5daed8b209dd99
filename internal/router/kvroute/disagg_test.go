package kvroute

import (
	"math"
	"net/url"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/routertest"
)

func pdBackend(name string) *fleet.Backend {
	return fleet.NewBackend(0, name, &url.URL{Scheme: "http", Host: name})
}

func TestSplitPrices(t *testing.T) {
	s := &Split{PrefillRate: 10_000, KVBytesPerToken: 1e5, LinkBandwidth: 1e9, Step: 10 * time.Millisecond}
	d, p := pdBackend("d"), pdBackend("p")
	p.Start(20_000, 20_000) // 2 s queued at the prefill server
	for range 4 {
		d.Start(0, 1000).FirstToken() // four streams decoding
	}
	req := &router.Request{PromptTokens: 10_000}
	dec := &router.Decision{Backend: d, Cached: 6_000, PredictedTTFT: 500 * time.Millisecond}
	whole, split := s.SplitPrices(req, dec, p)
	// whole: 0.5 s TTFT + a quarter of 4 streams × 4000/10000 s; split: 2 s queued + 1 s
	// prefill + 20 ms overhead + 1 s transfer (1e9 bytes at 1e9/s) + 10 ms.
	if math.Abs(whole-0.9) > 1e-9 || math.Abs(split-4.03) > 1e-9 {
		t.Errorf("prices whole %v split %v, want 0.9 and 4.03", whole, split)
	}
}

func TestSplitDecides(t *testing.T) {
	s := &Split{}
	first := func(int) int { return 0 }
	idle, queued := pdBackend("idle"), pdBackend("queued")
	queued.Start(300_000, 300_000) // ten seconds of prefill at the prior rate
	busyDecode := pdBackend("busy")
	for range 32 {
		busyDecode.Start(0, 2000).FirstToken()
	}
	tests := []struct {
		name     string
		tokens   int
		cached   int
		ttft     time.Duration
		decode   *fleet.Backend
		prefills []*fleet.Backend
		want     *fleet.Backend
	}{
		{name: "cached on the decode server", tokens: 8000, cached: 7900, ttft: 30 * time.Millisecond, decode: busyDecode, prefills: []*fleet.Backend{idle}},
		{name: "long prompt, decode busy", tokens: 8000, ttft: 300 * time.Millisecond, decode: busyDecode, prefills: []*fleet.Backend{queued, idle}, want: idle},
		{name: "prefill pool queued", tokens: 8000, ttft: 300 * time.Millisecond, decode: busyDecode, prefills: []*fleet.Backend{queued}},
		{name: "short prompt, idle decode", tokens: 50, ttft: 20 * time.Millisecond, decode: pdBackend("free"), prefills: []*fleet.Backend{idle}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &router.Decision{Backend: tt.decode, Cached: tt.cached, PredictedTTFT: tt.ttft}
			if got := s.Split(&router.Request{PromptTokens: tt.tokens}, d, tt.prefills, first); got != tt.want {
				t.Errorf("Split = %v, want %v", got, tt.want)
			}
		})
	}
}

// A request the splitter will split is placed for the split: by the decode
// server's KV room, not by the prefill it would have done there.
func TestPickChoosesTheDecodeServerForTheSplit(t *testing.T) {
	tests := []struct {
		name  string
		split bool // the splitter prices its way through the prefill pool
		want  int
	}{
		{name: "whole", want: 0},
		{name: "split", split: true, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs := routertest.Backends(2) // 400k tokens of KV each
			// b0 decodes 32 streams whose KV nearly fills it: the prompt
			// would wait there for a little room. b1 decodes 128 short
			// ones: prefilled there, the prompt stalls four times the streams.
			var flights []*fleet.Flight
			f := bs[0].Start(0, 380_000)
			f.FirstToken()
			flights = append(flights, f)
			for range 31 {
				f := bs[0].Start(0, 1000)
				f.FirstToken()
				flights = append(flights, f)
			}
			for range 128 {
				f := bs[1].Start(0, 1000)
				f.FirstToken()
				flights = append(flights, f)
			}
			p := New(bs, Config{Seed: 1, Now: frozenClock})
			req := &router.Request{Prompt: routertest.Words(1, 40_000), PromptTokens: 10_000, MaxTokens: 500}
			if tt.split {
				req.SplitTTFT = (&Split{}).SplitTTFT(req, []*fleet.Backend{pdBackend("p")})
			}
			d := routertest.Pick(t, p, req, bs)
			if d.Backend != bs[tt.want] {
				t.Errorf("picked %s, want %s; scores %+v", d.Backend.Name, bs[tt.want].Name, d.Scores)
			}
			if tt.split {
				if got := (&Split{}).Split(req, &d, []*fleet.Backend{pdBackend("p")}, func(int) int { return 0 }); got == nil {
					t.Errorf("the splitter keeps the request whole on %s", d.Backend.Name)
				}
			}
			for _, f := range flights {
				f.Done()
			}
		})
	}
}
