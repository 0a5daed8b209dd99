package sim

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/shareddata/sharedtest"
	"github.com/kvroute/kvroute/internal/workload"
)

// BenchmarkSimMooncake simulates the first two minutes of the Mooncake
// conversation trace, tiled to the fleet's size (about 1.6 requests/s per
// server: a loaded fleet), and reports the simulator's speed in requests
// and engine steps per second of wall time, with vLLM's 16-token KV blocks
// and with the trace's 512. The full-scale run (1,000 servers, a million
// requests) is a `kvroute sim` command in docs/BENCHMARKS.md (Scale).
func BenchmarkSimMooncake(b *testing.B) {
	path := sharedtest.Require(b, "mooncake/conversation_trace.jsonl")
	w, err := workload.Load("mooncake:"+path, workload.Options{Duration: 2 * time.Minute, Compress: 2})
	if err != nil {
		b.Fatal(err)
	}
	for _, blocks := range []int{16, 512} {
		for _, servers := range []int{8, 64} {
			for _, policy := range []string{"kvroute", "round-robin"} {
				b.Run(fmt.Sprintf("blocks=%d/servers=%d/%s", blocks, servers, policy), func(b *testing.B) {
					benchSim(b, Config{Workload: w, Backends: servers, Tile: servers / 8, Profile: profile(b).WithBlockSize(blocks),
						Policies: []string{policy}, Seed: 1, BoundsLimit: -1})
				})
			}
		}
	}
}

func benchSim(b *testing.B, cfg Config) {
	var st []Stats
	var err error
	for b.Loop() {
		_, st, err = RunStats(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
	}
	reqs := float64(cfg.Tile * cfg.Workload.Requests())
	b.ReportMetric(reqs/st[0].Wall.Seconds(), "requests/s")
	b.ReportMetric(float64(st[0].Steps)/st[0].Wall.Seconds(), "steps/s")
	b.ReportMetric(st[0].Virtual.Seconds()/st[0].Wall.Seconds(), "x-realtime")
}
