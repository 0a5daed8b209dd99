package fleet

import (
	"context"
	"encoding/json"
	"io"
)

// maxSlotsBody bounds a /slots response, in bytes. Without --slots-debug
// llama-server leaves the prompt text out: a slot is a few hundred bytes.
const maxSlotsBody = 4 << 20

// slot is what kvroute reads of one entry of llama-server's /slots.
type slot struct {
	// NCtx is the context the slot can hold, in tokens.
	NCtx int `json:"n_ctx"`
	// IsProcessing is set while the slot runs a request.
	IsProcessing bool `json:"is_processing"`
	// NPromptTokens is the prompt of the slot's current or last request.
	NPromptTokens int `json:"n_prompt_tokens"`
	// NextToken[0].NDecoded is how many tokens it has generated so far.
	NextToken []struct {
		NDecoded int `json:"n_decoded"`
	} `json:"next_token"`
}

// slotsLoad turns llama-server's slots into the signals its /metrics lacks:
// KV usage (llama.cpp dropped its KV gauge), the slot count and each slot's
// context. A slot's KV is "in use" only while it runs a request: an idle
// slot's tokens are cache, reusable or evictable at no cost, as vLLM counts
// freed blocks.
func slotsLoad(slots []slot) (usage float64, n, slotContext int) {
	var held, capacity int
	for _, s := range slots {
		capacity += s.NCtx
		if slotContext == 0 || s.NCtx < slotContext {
			slotContext = s.NCtx
		}
		if s.IsProcessing {
			held += s.NPromptTokens
			if len(s.NextToken) > 0 {
				held += s.NextToken[0].NDecoded
			}
		}
	}
	if capacity <= 0 {
		return -1, len(slots), 0
	}
	return min(float64(held)/float64(capacity), 1), len(slots), slotContext
}

// scrapeSlots reads a llama.cpp backend's /slots into met. A server started
// without --slots answers 501; then, as on any failure, met keeps what
// /metrics said and the failure is not logged (the endpoint is optional).
func (f *Fleet) scrapeSlots(ctx context.Context, m *member, met *Metrics) {
	var slots []slot
	err := f.fetch(ctx, m.b, m.slotsURL, "application/json", maxSlotsBody, func(r io.Reader) error {
		return json.NewDecoder(r).Decode(&slots)
	})
	if err != nil || len(slots) == 0 {
		return
	}
	usage, n, slotContext := slotsLoad(slots)
	met.Slots, met.SlotContext = n, slotContext
	if met.KVUsage < 0 && usage >= 0 {
		met.KVUsage = usage
	}
}
