package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/workload"
)

// Tiles of a trace whose arrivals were spread: each copy is spread over
// the same seconds on draws of its own, so no two of the tiled requests
// arrive at one instant (the tiles' shift by a fraction of the gap to the
// next request leaves a second's burst at one instant in every copy), and
// the order is the same whether the workload is merged tile by tile or
// listed whole.
func TestTilesOfSpreadArrivals(t *testing.T) {
	var b strings.Builder
	for s := range 3 {
		for range 10 {
			fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}`+"\n", s*1000)
		}
	}
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	at := map[bool]map[time.Duration]int{}
	for _, spread := range []bool{false, true} {
		opts := workload.Options{Seed: 1, Compress: 2}
		if spread {
			opts.SpreadArrivals = time.Second
		}
		w, err := workload.Load("mooncake:"+path, opts)
		if err != nil {
			t.Fatal(err)
		}
		cfg := Config{Workload: w, Tile: 4}
		o := newOrder(cfg)
		list := sessionOrder(cfg)
		at[spread] = map[time.Duration]int{}
		prev := time.Duration(-1)
		for i := 0; o.left(); i++ {
			r := o.pop()
			if r != list[i] {
				t.Fatalf("spread %v: merged order %+v, listed %+v at %d", spread, r, list[i], i)
			}
			if r.start < prev {
				t.Fatalf("spread %v: %+v after %v", spread, r, prev)
			}
			if sec := time.Duration(r.base/10) * time.Second / 2; r.start < sec || r.start >= sec+time.Second/2 {
				t.Errorf("spread %v: tile %d of request %d at %v, outside its second [%v, %v)", spread, r.tile, r.base, r.start, sec, sec+time.Second/2)
			}
			prev = r.start
			at[spread][r.start]++
		}
	}
	// Without: each second's first 9 requests in all 4 tiles at its mark,
	// the 10th's tiles at fractions of the half second to the next.
	if len(at[false]) != 9 {
		t.Errorf("without spread the 120 tiled requests arrive at %d instants, expected the bursts this test assumes", len(at[false]))
	}
	if len(at[true]) != 120 {
		t.Errorf("spread, the 120 tiled requests arrive at %d instants, want 120", len(at[true]))
	}
}
