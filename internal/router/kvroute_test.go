package router

import "testing"

func TestKVRouteTiesGoToTheCache(t *testing.T) {
	bs := backends(4)
	p := NewKVRoute(bs, KVRouteConfig{Seed: 1})
	// A 64-token shared head saves a few milliseconds of prefill: within
	// the tie tolerance, yet the backend holding it must win the tie.
	head := words(0, 256)
	holder := pick(t, p, &Request{Prompt: head + words(1, 100)}, bs).Backend
	for i := range 50 {
		d := pick(t, p, &Request{Prompt: head + words(i+2, 100)}, bs)
		if d.Backend != holder {
			t.Fatalf("request %d went to %s, away from %s that holds its head", i, d.Backend.Name, holder.Name)
		}
	}
}

func TestKVRouteForgetsTokenBlocksOfFailedRequest(t *testing.T) {
	bs := backends(2)
	p := NewKVRoute(bs, KVRouteConfig{Seed: 1})
	blocks := make([]uint64, 64)
	for i := range blocks {
		blocks[i] = uint64(i + 1)
	}
	req := &Request{PromptTokens: 1024, TokenBlocks: blocks, TokenBlockSize: 16}
	d := pick(t, p, req, bs)
	p.Observe(Outcome{Request: req, Decision: d, Status: 0, PromptTokens: -1, CachedTokens: -1})
	if n := p.index.Len(d.Backend.Index); n != 0 {
		t.Errorf("the index still holds %d blocks of a prompt the backend never saw", n)
	}
}
