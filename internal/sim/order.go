package sim

import (
	"container/heap"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/workload"
)

// order yields the sessions of the (tiled) workload by start time, ties in
// tile order, then workload order. A tile's copy of a session starts at the
// same time shifted by a fraction of the gap to the next session, so that
// copies do not arrive in lockstep; when the workload's arrivals were
// spread (workload.Options.SpreadArrivals), each copy is spread over the
// trace's seconds on draws of its own instead (tileStart).
//
// Ten million tiled sessions listed up front would take 160 MB; when the
// workload's sessions are in start order (every trace), each tile's copies
// are too, and a merge of the tiles yields the same order from one pending
// session per tile.
type order struct {
	cfg   Config
	list  []sessionRef // the whole order, when the workload is not sorted
	tiles tileHeap     // else each tile's next session
	// spread holds each tile's last cell of spread arrivals.
	spread []workload.SpreadScratch
	total  int
	taken  int
}

func newOrder(cfg Config) *order {
	o := &order{cfg: cfg, total: len(cfg.Workload.Sessions) * cfg.Tile}
	if cfg.Workload.Spread != nil {
		o.spread = make([]workload.SpreadScratch, cfg.Tile)
	}
	ss := cfg.Workload.Sessions
	sorted := slices.IsSortedFunc(ss, func(a, b workload.Session) int { return cmpDuration(a.Start, b.Start) })
	if !sorted || cfg.Tile == 1 {
		o.list = sessionOrder(cfg)
		return o
	}
	for t := range cfg.Tile {
		o.tiles = append(o.tiles, o.ref(0, t))
	}
	heap.Init(&o.tiles)
	return o
}

// ref is tile t's copy of session i.
func (o *order) ref(i, t int) sessionRef {
	var scratch *workload.SpreadScratch
	if o.spread != nil {
		scratch = &o.spread[t]
	}
	return sessionRef{start: tileStart(o.cfg, i, t, scratch), base: int32(i), tile: int32(t)}
}

// tileStart is when tile t's copy of session i starts. Copy 0 is the
// workload's own. The others are shifted by a fraction of the gap to the
// next session; but a trace logged in whole seconds has no gap within a
// second, and every copy of a second's burst arrived at one instant with
// it. Spread arrivals give each copy draws of its own over the same
// seconds (workload.Spread.Copy): copies that are each a trace's possible
// arrivals, as independent streams would be, not one stream's gaps cut
// into even parts. scratch (nil without a spread) keeps a tile's draws.
func tileStart(cfg Config, i, t int, scratch *workload.SpreadScratch) time.Duration {
	ss := cfg.Workload.Sessions
	start := ss[i].Start
	switch {
	case t == 0:
	case cfg.Workload.Spread != nil:
		start = cfg.Workload.Spread.Copy(i, t, scratch)
	case i+1 < len(ss):
		gap := ss[i+1].Start - start
		start += time.Duration(float64(gap) * float64(t) / float64(cfg.Tile))
	}
	return start
}

// left reports whether sessions remain.
func (o *order) left() bool { return o.taken < o.total }

// peek returns the next session; left must be true.
func (o *order) peek() sessionRef {
	if o.list != nil {
		return o.list[o.taken]
	}
	return o.tiles[0]
}

// pop returns the next session and moves past it; left must be true.
func (o *order) pop() sessionRef {
	r := o.peek()
	o.taken++
	if o.list == nil {
		if next := int(r.base) + 1; next < len(o.cfg.Workload.Sessions) {
			o.tiles[0] = o.ref(next, int(r.tile))
			heap.Fix(&o.tiles, 0)
		} else {
			heap.Pop(&o.tiles)
		}
	}
	return r
}

// tileHeap orders the tiles' pending sessions as sessionOrder's stable
// sort does: by start, then tile (a stable sort keeps tile-major order).
type tileHeap []sessionRef

func (h tileHeap) Len() int { return len(h) }
func (h tileHeap) Less(a, b int) bool {
	if h[a].start != h[b].start {
		return h[a].start < h[b].start
	}
	if h[a].tile != h[b].tile {
		return h[a].tile < h[b].tile
	}
	return h[a].base < h[b].base
}
func (h tileHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *tileHeap) Push(x any)   { *h = append(*h, x.(sessionRef)) }
func (h *tileHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func cmpDuration(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
