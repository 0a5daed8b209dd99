package fleet

import (
	"testing"
)

// llamacppSlots is llama-server's /slots (without --slots-debug) with two
// slots of 4096 tokens: one mid-request, one idle after a request.
const llamacppSlots = `[
 {"id":0,"n_ctx":4096,"speculative":false,"is_processing":true,"id_task":7,
  "n_prompt_tokens":1000,"n_prompt_tokens_processed":200,"n_prompt_tokens_cache":800,
  "params":{"n_predict":64},"next_token":[{"has_next_token":true,"has_new_line":false,"n_remain":40,"n_decoded":24}]},
 {"id":1,"n_ctx":4096,"speculative":false,"is_processing":false,"id_task":3,
  "n_prompt_tokens":3000,"n_prompt_tokens_processed":3000,"n_prompt_tokens_cache":0,
  "params":{"n_predict":64},"next_token":[{"has_next_token":false,"has_new_line":false,"n_remain":0,"n_decoded":64}]}
]`

func TestScrapeLlamaSlots(t *testing.T) {
	tests := []struct {
		name   string
		slots  string
		want   Metrics
		nSlots int
	}{
		// Only the busy slot's context is in use: 1,024 of 8,192 tokens.
		{"with /slots", llamacppSlots, Metrics{Running: 1, KVUsage: 0.125, PrefixHits: 800, PrefixQueries: 2000, BusySeconds: 3.5}, 2},
		{"without /slots", "", Metrics{Running: 1, KVUsage: -1, PrefixHits: 800, PrefixQueries: 2000, BusySeconds: 3.5}, 0},
		{"malformed /slots", `{"error":`, Metrics{Running: 1, KVUsage: -1, PrefixHits: 800, PrefixQueries: 2000, BusySeconds: 3.5}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := newFakeBackend(t, `{"data":[{"id":"m"}]}`, llamacppCachedMetrics)
			fb.set(func(fb *fakeBackend) { fb.slots = tt.slots })
			clock := newFakeClock()
			f, bs, _ := newTestFleet(t, Options{Now: clock.Now}, fb)
			f.Refresh(t.Context())
			got := f.Metrics(bs[0])
			if got == nil {
				t.Fatal("no metrics")
			}
			want := tt.want
			want.At = clock.Now()
			if !closeMetrics(*got, want) || got.BusySeconds != want.BusySeconds {
				t.Errorf("Metrics = %+v\nwant      %+v", *got, want)
			}
			if got.Slots != tt.nSlots || (tt.nSlots > 0 && got.SlotContext != 4096) {
				t.Errorf("Slots, SlotContext = %d, %d; want %d, 4096", got.Slots, got.SlotContext, tt.nSlots)
			}
		})
	}
}

func TestSlotsLoad(t *testing.T) {
	tests := []struct {
		name       string
		slots      []slot
		usage      float64
		n, slotCtx int
	}{
		{"none", nil, -1, 0, 0},
		{"all idle", []slot{{NCtx: 100, NPromptTokens: 90}, {NCtx: 100}}, 0, 2, 100},
		{"smallest context", []slot{{NCtx: 100, IsProcessing: true, NPromptTokens: 50}, {NCtx: 60}}, 50.0 / 160, 2, 60},
		{"clamped", []slot{{NCtx: 10, IsProcessing: true, NPromptTokens: 50}}, 1, 1, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			usage, n, slotCtx := slotsLoad(tt.slots)
			if usage != tt.usage || n != tt.n || slotCtx != tt.slotCtx {
				t.Errorf("slotsLoad = %v, %d, %d; want %v, %d, %d", usage, n, slotCtx, tt.usage, tt.n, tt.slotCtx)
			}
		})
	}
}
