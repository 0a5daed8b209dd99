package sim

import (
	"context"
	"fmt"
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

// A burst of prompts arriving at one instant, split over four replicas:
// counts shared by a poll (every 100 ms) cannot reach the others before
// they route their share, and they send several prompts to one server while
// others stay idle; shared before every decision (GossipEachRequest), every
// replica sees what the others just sent, as one router would, and the
// burst spreads one prompt a server. Mooncake's trace arrives in such
// bursts (docs/BENCHMARKS.md, Router replicas).
func TestGossipEachRequestSpreadsABurst(t *testing.T) {
	const servers = 16
	w := burst(servers, 0)
	mostOnOne := func(each bool) int {
		return mostOnOneServer(t, Config{
			Workload: w, Backends: servers, Routers: 4, Gossip: 100 * time.Millisecond, GossipEachRequest: each,
			Profile: profile(t), Policies: []string{"kvroute"}, Seed: 1,
		})
	}
	polled, each := mostOnOne(false), mostOnOne(true)
	t.Logf("most prompts of the burst on one server: %d with counts polled, %d shared before every decision", polled, each)
	if polled < 2 {
		t.Errorf("counts shared every 100 ms: at most %d prompt(s) of the burst on a server, want a herd (2 or more)", polled)
	}
	if each != 1 {
		t.Errorf("counts shared before every decision: %d prompts of the burst on one server, want 1", each)
	}
}

// The same burst arriving over 16 ms, a prompt a millisecond, split over
// four replicas: counts pushed as they change (GossipPush, 0.5 ms on a
// LAN) reach the others before their next prompt, and the burst spreads one
// prompt a server as one router spreads it, deciding as one router (the
// default) or as a replica (PushAsReplica); polled every 100 ms they herd
// as before.
func TestGossipPushSpreadsABurst(t *testing.T) {
	const servers = 16
	w := burst(servers, time.Millisecond)
	mostOnOne := func(routers int, gossip, push time.Duration, asOne bool) int {
		return mostOnOneServer(t, Config{
			Workload: w, Backends: servers, Routers: routers, Gossip: gossip, GossipPush: push, PushAsReplica: !asOne,
			KVEvents: true, Profile: profile(t), Policies: []string{"kvroute"}, Seed: 1,
		})
	}
	one := mostOnOne(1, 0, 0, false)
	polled := mostOnOne(4, 100*time.Millisecond, 0, false)
	pushed := mostOnOne(4, 0, 500*time.Microsecond, false)
	pushedOne := mostOnOne(4, 0, 500*time.Microsecond, true)
	t.Logf("most prompts of the burst on one server: one router %d; 4 replicas, counts polled %d, pushed %d (as one router: %d)", one, polled, pushed, pushedOne)
	if one != 1 {
		t.Fatalf("one router put %d prompts of the burst on one server, want 1", one)
	}
	if polled < 2 {
		t.Errorf("counts polled every 100 ms: at most %d prompt(s) of the burst on a server, want a herd (2 or more)", polled)
	}
	if pushed != 1 || pushedOne != 1 {
		t.Errorf("counts pushed: %d prompts of the burst on one server as a replica, %d as one router, want 1", pushed, pushedOne)
	}
}

// A pushed count reaches the other replicas after the delay and not
// before: a replica's view of a server is its own count plus the others'
// as they were GossipPush ago.
func TestGossipPushArrivesAfterTheDelay(t *testing.T) {
	w := workload.Workload{Name: "one", Sessions: []workload.Session{{ID: "a", Turns: []workload.Turn{
		{Blocks: []uint64{1, 2}, BlockTokens: 512, Tokens: 1024, MaxTokens: 5}}}}}
	cfg, err := Config{Workload: w, Backends: 2, Routers: 3, GossipPush: time.Millisecond, Profile: profile(t), Policies: []string{"kvroute"}, Seed: 1}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	s, err := newSimulation(cfg, "kvroute", false)
	if err != nil {
		t.Fatal(err)
	}
	s.startNext(0)
	ev := s.q.pop()
	s.now = ev.at
	s.send(int(ev.idx))
	f := s.flights[0]
	server := f.t.Backend.Index
	other := s.replicas[(int(f.replica)+1)%3].backends[server]
	if pl := other.PeerLoad(s.clock(), time.Hour); pl == nil || pl.Requests != 0 || pl.Peers != 2 {
		t.Fatalf("before the delay another replica sees %+v, want the peers' empty counts", pl)
	}
	for s.q.len() > 0 {
		ev := s.q.pop()
		if ev.kind != evPush {
			continue
		}
		s.now = ev.at
		s.push.deliver()
		break
	}
	if s.now != time.Millisecond {
		t.Fatalf("the push arrived at %v, want 1ms", s.now)
	}
	if pl := other.PeerLoad(s.clock(), time.Hour); pl == nil || pl.Requests != 1 || pl.PrefillTokens == 0 {
		t.Errorf("after the delay another replica sees %+v, want the request", pl)
	}
	if own := s.replicas[f.replica].backends[server].PeerLoad(s.clock(), time.Hour); own == nil || own.Requests != 0 {
		t.Errorf("the sender counts its own request among its peers': %+v", own)
	}
}

// mostOnOneServer runs cfg and returns the most requests any server got.
func mostOnOneServer(t *testing.T, cfg Config) int {
	t.Helper()
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	most := 0
	for _, r := range res.Runs[0].Requests {
		per[r.Backend]++
		most = max(most, per[r.Backend])
	}
	return most
}

// burst is n one-turn sessions of distinct 16-block prompts, the i-th
// starting at i × every (0: all at one instant).
func burst(n int, every time.Duration) workload.Workload {
	w := workload.Workload{Name: "burst"}
	for i := range n {
		blocks := make([]uint64, 16)
		for j := range blocks {
			blocks[j] = uint64(i*100 + j + 1)
		}
		w.Sessions = append(w.Sessions, workload.Session{ID: fmt.Sprintf("s%d", i), Start: time.Duration(i) * every,
			Turns: []workload.Turn{{Blocks: blocks, BlockTokens: 512, Tokens: 16 * 512, MaxTokens: 50}}})
	}
	return w
}

// Bursts of prompts at one instant, split over four replicas behind
// pushed counts with the engines' events: no count reaches another replica
// within an instant, and each keeps its share to its own lane (a quarter
// of the servers), so the bursts double up on fewer servers than as
// replicas deciding alike (PushAsReplica).
func TestGossipPushLanesBursts(t *testing.T) {
	const servers, bursts = 16, 12
	var w workload.Workload
	for k := range bursts {
		b := burst(servers, 0)
		for i := range b.Sessions {
			s := &b.Sessions[i]
			s.ID = fmt.Sprintf("b%d-%s", k, s.ID)
			s.Start = time.Duration(k) * time.Second
			for j := range s.Turns[0].Blocks {
				s.Turns[0].Blocks[j] += uint64(k) << 32
			}
		}
		w.Sessions = append(w.Sessions, b.Sessions...)
	}
	w.Name = "bursts"
	doubled := func(asReplica bool) int {
		res, err := Run(context.Background(), Config{
			Workload: w, Backends: servers, Routers: 4, GossipPush: 500 * time.Microsecond, PushAsReplica: asReplica,
			KVEvents: true, Profile: profile(t), Policies: []string{"kvroute"}, Seed: 1,
		})
		if err != nil {
			t.Fatal(err)
		}
		type at struct {
			backend string
			sent    time.Duration
		}
		seen := map[at]bool{}
		n := 0
		for _, r := range res.Runs[0].Requests {
			k := at{r.Backend, r.Sent}
			if seen[k] {
				n++
			}
			seen[k] = true
		}
		return n
	}
	lanes, alike := doubled(false), doubled(true)
	t.Logf("prompts sent to a server another of its burst went to: %d in lanes, %d as replicas", lanes, alike)
	if lanes >= alike {
		t.Errorf("in lanes %d prompts of a burst shared a server, as replicas %d: want fewer", lanes, alike)
	}
}
