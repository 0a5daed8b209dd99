package policies

import (
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/kvroute"
)

// A caller that gives the prompt's token blocks and length (the simulator)
// gets the same routing by prefix as one that gives text: a repeated prefix
// goes where it was sent, predicted cached in whole index blocks, whether
// the caller's blocks are finer than the policies' index blocks or coarser.
func TestTokenBlocksStandInForText(t *testing.T) {
	for _, tc := range []struct {
		blockSize, blocks, first int
	}{
		{blockSize: 16, blocks: 100, first: 64},
		{blockSize: 512, blocks: 10, first: 6},
	} {
		blocks := make([]uint64, tc.blocks)
		for i := range blocks {
			blocks[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
		}
		prompt, cached := tc.blocks*tc.blockSize, tc.first*tc.blockSize
		for _, name := range []string{"kvroute", "dynamo-kv", "preble-e2", "llmd-default", "sglang-cache-aware"} {
			t.Run(fmt.Sprintf("%s/blocks of %d", name, tc.blockSize), func(t *testing.T) {
				bs := []*fleet.Backend{fleet.NewBackend(0, "a", nil), fleet.NewBackend(1, "b", nil), fleet.NewBackend(2, "c", nil)}
				p, err := New(name, bs, Options{Seed: 1})
				if err != nil {
					t.Fatal(err)
				}
				first := &router.Request{Model: "m", PromptTokens: prompt, TokenBlocks: blocks[:tc.first], TokenBlockSize: tc.blockSize, MaxTokens: 10}
				d1, err := p.Route(first, bs)
				if err != nil {
					t.Fatal(err)
				}
				d1.Finish(router.Failed(499))
				if first.PromptTokens != prompt {
					t.Errorf("first: %d prompt tokens, want the given %d", first.PromptTokens, prompt)
				}
				second := &router.Request{Model: "m", PromptTokens: prompt, TokenBlocks: blocks, TokenBlockSize: tc.blockSize, MaxTokens: 10}
				d2, err := p.Route(second, bs)
				if err != nil {
					t.Fatal(err)
				}
				d2.Finish(router.Failed(499))
				if d2.Backend != d1.Backend || d2.Cached != cached {
					t.Errorf("second: %s with %d cached tokens, want %s with %d", d2.Backend.Name, d2.Cached, d1.Backend.Name, cached)
				}
			})
		}
	}
}

// Replicas unaware of each other's decisions still send a session's turns
// to one backend: the one consistent hashing of its key ranks first among
// the near-cheapest, whichever replica routes the turn.
func TestReplicasAgreeOnSessions(t *testing.T) {
	bs := make([]*fleet.Backend, 8)
	for i := range bs {
		bs[i] = fleet.NewBackend(i, string(rune('a'+i)), nil)
	}
	var replicas []*router.Router
	for r := range 3 {
		p, err := New("kvroute", bs, Options{Seed: uint64(r + 1), KVRoute: kvroute.Config{Replicas: 3}})
		if err != nil {
			t.Fatal(err)
		}
		replicas = append(replicas, p)
	}
	spread := map[string]bool{}
	for s := range 40 {
		key := string(rune('A'+s%26)) + string(rune('a'+s/26))
		var first *fleet.Backend
		for turn := range 3 {
			req := &router.Request{Model: "m", SessionKey: key, Prompt: "user\nhello there, turn " + string(rune('0'+turn)) + "\n", MaxTokens: 10}
			d, err := replicas[(s+turn)%3].Route(req, bs)
			if err != nil {
				t.Fatal(err)
			}
			d.Finish(router.Failed(499))
			if first == nil {
				first = d.Backend
			} else if d.Backend != first {
				t.Fatalf("session %s: turn %d on %s, turn 0 on %s", key, turn, d.Backend.Name, first.Name)
			}
		}
		spread[first.Name] = true
	}
	if len(spread) < 6 {
		t.Errorf("40 sessions on %d of 8 backends: hashing should spread them", len(spread))
	}
}
