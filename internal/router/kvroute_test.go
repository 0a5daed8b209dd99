package router

import (
	"testing"
	"time"
)

func TestKVRouteTiesGoToTheCache(t *testing.T) {
	bs := backends(4)
	p := NewKVRoute(bs, KVRouteConfig{Seed: 1, Now: frozenClock})
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
	p := NewKVRoute(bs, KVRouteConfig{Seed: 1, Now: frozenClock})
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

func TestKVRouteRemembersBeyondTheIndex(t *testing.T) {
	bs := backends(4)
	p := NewKVRoute(bs, KVRouteConfig{Seed: 1, Now: frozenClock})
	conv := words(0, 16_000) // 4k tokens
	first := pick(t, p, &Request{Prompt: conv}, bs)
	// The index forgets the conversation (other prompts passed through the
	// backend's cache), recent does not.
	p.index.SetCapacity(first.Backend.Index, 1)
	next := &Request{Prompt: conv + words(1, 400)}
	d := pick(t, p, next, bs)
	if d.Backend != first.Backend {
		t.Fatalf("turn 2 went to %s, away from %s that probably still holds turn 1", d.Backend.Name, first.Backend.Name)
	}
	// Counted as a miss but for the block the index kept: the queue behind
	// it must not be underestimated.
	if d.PrefixTokens > 64 {
		t.Errorf("counted %d cached tokens where the index holds one block", d.PrefixTokens)
	}
	for _, s := range d.Scores {
		if s.Backend == first.Backend.Name && s.Cached <= 0 {
			t.Errorf("score %+v: recent's memory is worth nothing", s)
		}
	}
}

func TestKVRouteLearnsWhatRecentMemoryIsWorth(t *testing.T) {
	for _, tt := range []struct {
		name   string
		cached bool
		rises  bool
	}{
		{name: "still cached", cached: true, rises: true},
		{name: "evicted", cached: false, rises: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bs := backends(1)
			p := NewKVRoute(bs, KVRouteConfig{Seed: 1, Now: frozenClock})
			before := p.recentHit / p.recentSeen
			for i := range 20 {
				conv := words(i, 16_000)
				pick(t, p, &Request{Prompt: conv}, bs)
				p.index.SetCapacity(0, 1)
				req := &Request{Prompt: conv + words(100+i, 400)}
				d := pick(t, p, req, bs)
				cached := 0
				if tt.cached {
					cached = 4000
				}
				p.Observe(Outcome{Request: req, Decision: d, Status: 200, PromptTokens: d.PromptTokens,
					CachedTokens: cached, TTFT: 100 * time.Millisecond})
			}
			after := p.recentHit / p.recentSeen
			if (after > before) != tt.rises {
				t.Errorf("odds %.2f -> %.2f", before, after)
			}
			if len(p.pending) != 0 {
				t.Errorf("%d outcomes still pending", len(p.pending))
			}
		})
	}
}
