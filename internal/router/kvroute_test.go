package router

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
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
	r := newKVRouter(bs, KVRouteConfig{Seed: 1, Now: frozenClock})
	blocks := make([]uint64, 64)
	for i := range blocks {
		blocks[i] = uint64(i + 1)
	}
	req := func() *Request { return &Request{PromptTokens: 1024, TokenBlocks: blocks, TokenBlockSize: 16} }
	d := route(t, r, req(), bs)
	d.Finish(Failed(0))
	again := route(t, r, req(), bs)
	again.Finish(Failed(499))
	if s := scoreOf(t, again.Decision, d.Backend); s.Cached != 0 {
		t.Errorf("%s is still predicted to hold %d tokens of a prompt it never saw", d.Backend.Name, s.Cached)
	}
}

// smallCache gives every backend of bs 2,560 tokens of KV: an index of 40
// blocks of 256 bytes, and a memory of what it held lately of 80.
func smallCache(bs []*fleet.Backend) {
	for _, b := range bs {
		b.SetInfo(&fleet.Info{Models: []string{"m"}, BlockSize: 16, KVBlocks: 160})
	}
}

func TestKVRouteRemembersBeyondTheIndex(t *testing.T) {
	bs := backends(4)
	smallCache(bs)
	r := newKVRouter(bs, KVRouteConfig{Seed: 1, Now: frozenClock})
	conv := words(0, 16_000) // 4k tokens, 62 blocks: more than the index keeps
	first := route(t, r, &Request{Prompt: conv}, bs)
	// Served: the index learns the backend's real capacity and forgets
	// part of the conversation; recent does not.
	first.Finish(served(4000, 0, 100*time.Millisecond))
	d := route(t, r, &Request{Prompt: conv + words(1, 400)}, bs)
	d.Finish(Failed(499))
	if d.Backend != first.Backend {
		t.Fatalf("turn 2 went to %s, away from %s that probably still holds turn 1", d.Backend.Name, first.Backend.Name)
	}
	// Counted as a miss but for the blocks the index kept: the queue behind
	// it must not be underestimated.
	if d.Cached > 40*64 {
		t.Errorf("counted %d cached tokens where the index holds at most 40 blocks", d.Cached)
	}
	if s := scoreOf(t, d.Decision, first.Backend); s.Cached <= d.Cached {
		t.Errorf("score %+v: recent's memory is worth nothing beyond the index's %d tokens", s, d.Cached)
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
			smallCache(bs)
			r := newKVRouter(bs, KVRouteConfig{Seed: 1, Now: frozenClock})
			// What kvroute expects cached of a turn whose previous turn only
			// recent remembers whole, at its first and its last outcome.
			var worth []int
			for i := range 20 {
				conv := words(i, 16_000)
				route(t, r, &Request{Prompt: conv}, bs).Finish(served(4000, 0, 100*time.Millisecond))
				d := route(t, r, &Request{Prompt: conv + words(100+i, 400)}, bs)
				s := scoreOf(t, d.Decision, bs[0])
				if s.Cached <= d.Cached {
					t.Fatalf("turn %d: recent predicts nothing beyond the index (%+v)", i, s)
				}
				worth = append(worth, s.Cached-d.Cached)
				cached := 0
				if tt.cached {
					cached = 4000
				}
				d.Finish(served(4100, cached, 100*time.Millisecond))
			}
			before, after := worth[0], worth[len(worth)-1]
			if (after > before) != tt.rises {
				t.Errorf("recent's memory worth %d tokens, then %d", before, after)
			}
		})
	}
}
