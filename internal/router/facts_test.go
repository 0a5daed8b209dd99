package router

import (
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
)

// A caller that gives the prompt's token blocks and length (the simulator)
// gets the same routing by prefix as one that gives text: a repeated prefix
// goes where it was sent, predicted cached in whole index blocks.
func TestTokenBlocksStandInForText(t *testing.T) {
	blocks := make([]uint64, 100) // 1,600 tokens in blocks of 16
	for i := range blocks {
		blocks[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	for _, name := range []string{"kvroute", "dynamo-kv", "preble-e2", "llmd-default", "sglang-cache-aware"} {
		t.Run(name, func(t *testing.T) {
			bs := []*fleet.Backend{fleet.NewBackend(0, "a", nil), fleet.NewBackend(1, "b", nil), fleet.NewBackend(2, "c", nil)}
			p, err := New(name, bs, Options{Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			first := &Request{Model: "m", PromptTokens: 1600, TokenBlocks: blocks[:64], TokenBlockSize: 16, MaxTokens: 10}
			d1, err := p.Pick(first, bs)
			if err != nil {
				t.Fatal(err)
			}
			if d1.PromptTokens != 1600 {
				t.Errorf("first: %d prompt tokens, want the given 1600", d1.PromptTokens)
			}
			second := &Request{Model: "m", PromptTokens: 1600, TokenBlocks: blocks, TokenBlockSize: 16, MaxTokens: 10}
			d2, err := p.Pick(second, bs)
			if err != nil {
				t.Fatal(err)
			}
			if d2.Backend != d1.Backend || d2.PrefixTokens != 1024 {
				t.Errorf("second: %s with %d cached tokens, want %s with 1024", d2.Backend.Name, d2.PrefixTokens, d1.Backend.Name)
			}
		})
	}
}
