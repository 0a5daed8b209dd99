package sim

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/workload"
)

// Four router replicas behind a random split on a chat fleet of 16:
// sharing their in-flight counts every 100 ms (as `serve --peer` does)
// keeps bursts that each replica sees a quarter of from herding, so the
// TTFT tail is shorter than when each replica scales its own counts, and
// the prompts stay as cached.
func TestGossipShortensTheTail(t *testing.T) {
	w, err := workload.Load("chat", workload.Options{Rate: 17, Duration: 20 * time.Second, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	run := func(gossip time.Duration) (p99 time.Duration, hit float64) {
		res, err := Run(context.Background(), Config{
			Workload: w,
			Backends: 16, Routers: 4, Gossip: gossip, Profile: profile(t), Policies: []string{"kvroute"}, Seed: 1,
		})
		if err != nil {
			t.Fatal(err)
		}
		s := res.Runs[0].Summary
		return s.TTFTP99, s.HitRate
	}
	alone, aloneHit := run(0)
	shared, sharedHit := run(100 * time.Millisecond)
	t.Logf("TTFT p99 %v → %v with gossip; hit rate %.1f %% → %.1f %%", alone, shared, 100*aloneHit, 100*sharedHit)
	if shared >= alone {
		t.Errorf("TTFT p99 with gossip %v, without %v: sharing the counts did not shorten the tail", shared, alone)
	}
	if sharedHit < aloneHit-0.01 {
		t.Errorf("hit rate with gossip %.3f, without %.3f", sharedHit, aloneHit)
	}
}
