package kvroute

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// With M replicas, kvroute counts a backend's load as its own plus what the
// peers reported while the report is fresh, each silent replica standing in
// as a copy of its own; with no report it scales its own by M.
func TestReplicaLoadAddsPeers(t *testing.T) {
	now := time.Unix(100, 0)
	p := New(nil, Config{Replicas: 4, PeerMaxAge: time.Second, Now: func() time.Time { return now }})
	b := fleet.NewBackend(0, "b", nil)
	b.Start(100, 200)

	if got, want := first(p.load(b, now)), (fleet.Load{Requests: 4, PrefillTokens: 400, DecodeTokens: 800}); got != want {
		t.Errorf("no peers: %+v, want own × 4 = %+v", got, want)
	}
	b.SetPeerLoad(&fleet.PeerLoad{Load: fleet.Load{Requests: 5, PrefillTokens: 50, Decoding: 3, DecodeTokens: 70}, Peers: 2, At: now})
	// own + the two peers' + one silent replica's (own once more)
	if got, want := first(p.load(b, now)), (fleet.Load{Requests: 7, PrefillTokens: 250, Decoding: 3, DecodeTokens: 470}); got != want {
		t.Errorf("two of three peers heard: %+v, want %+v", got, want)
	}
	if got, want := first(p.load(b, now.Add(2*time.Second))), (fleet.Load{Requests: 4, PrefillTokens: 400, DecodeTokens: 800}); got != want {
		t.Errorf("stale peers: %+v, want own × 4 = %+v", got, want)
	}
}

// A burst split across two replicas: each has sent two long requests to
// the first backend it found idle. Aware of the other's (through the peer
// report), the second replica sends its next request elsewhere; on its own
// counts it would have piled onto the same backend.
func TestPeerLoadStopsHerding(t *testing.T) {
	now := time.Unix(100, 0)
	clock := func() time.Time { return now }
	newReplica := func() (*router.Router, []*fleet.Backend) {
		bs := []*fleet.Backend{fleet.NewBackend(0, "a", nil), fleet.NewBackend(1, "b", nil)}
		r, err := newRouter(bs, 1, clock, Config{Replicas: 2})
		if err != nil {
			t.Fatal(err)
		}
		return r, bs
	}
	r2, bs2 := newReplica()
	// Replica 2 has one request of its own in flight on b; replica 1 has
	// three heavy prefills queued on a.
	t2, err := r2.Route(&router.Request{Prompt: "other work", MaxTokens: 10}, []*fleet.Backend{bs2[1]})
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Finish(router.Failed(0))
	bs2[0].SetPeerLoad(&fleet.PeerLoad{Load: fleet.Load{Requests: 3, PrefillTokens: 60_000, DecodeTokens: 60_000}, Peers: 1, At: now})
	bs2[1].SetPeerLoad(&fleet.PeerLoad{Peers: 1, At: now})
	tk, err := r2.Route(&router.Request{Prompt: "a new prompt", MaxTokens: 10}, bs2)
	if err != nil {
		t.Fatal(err)
	}
	defer tk.Finish(router.Failed(0))
	if got := tk.Decision.Backend.Name; got != "b" {
		t.Errorf("picked %s: the peer's queue on a was not counted", got)
	}
}

func first(l fleet.Load, _ peerPrefill) fleet.Load { return l }

// Placement compares costs without the stream's price, which replicas
// estimate from counts that differ between them: a backend dearer only by
// its stream stays within the slack, and one dearer by its prefill does
// not, whatever the hash says.
func TestPlacementLeavesOutTheStream(t *testing.T) {
	p := New(nil, Config{Replicas: 2})
	cands := []*fleet.Backend{fleet.NewBackend(0, "a", nil), fleet.NewBackend(1, "b", nil)}
	for _, tc := range []struct {
		name string
		cand []candidate
		want int
	}{
		{"dearer by the stream", []candidate{{cost: 0.3}, {cost: 2.3, stream: 2.05}}, -1}, // both placeable: the hash decides
		{"dearer by the prefill", []candidate{{cost: 0.3}, {cost: 0.6}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkPlaced(t, p, tc.cand, cands, tc.want)
		})
	}
}

// A pruned pick orders the backends by their requests in flight with the
// peers' reports, each backend reordered as its report arrives, whether a
// round of polls replaces them all or a push just one, and its load bound
// counts the fleet's as the pruner sums them, each silent replica standing
// in as the heard ones' mean; with no reports, its own times the replicas.
func TestPrunerWeighsPeers(t *testing.T) {
	now := time.Unix(100, 0)
	bs := []*fleet.Backend{fleet.NewBackend(0, "a", nil), fleet.NewBackend(1, "b", nil), fleet.NewBackend(2, "c", nil)}
	p := New(bs, Config{Replicas: 4, PeerMaxAge: time.Second, Now: func() time.Time { return now }})
	bs[1].Start(10, 10)
	least := func() []int32 {
		p.prune.mu.Lock()
		defer p.prune.mu.Unlock()
		return p.prune.least(nil, bs, p.prune.positions("", bs), lane{}, 1)
	}
	if got := least(); len(got) != 1 || got[0] == 1 {
		t.Errorf("no reports: least loaded %v, want an idle one", got)
	}
	if got, want := p.fleetInFlight(1, bs, now), int64(4); got != want {
		t.Errorf("no reports: fleet in flight %d, want own × 4 = %d", got, want)
	}
	report := func(requests ...int64) {
		for i, b := range bs {
			b.SetPeerLoad(&fleet.PeerLoad{Load: fleet.Load{Requests: requests[i]}, Peers: 2, At: now})
		}
	}
	report(5, 0, 7)
	if got := least(); len(got) != 1 || got[0] != 1 {
		t.Errorf("peers busy on a and c: least loaded %v, want b", got)
	}
	p.prune.mu.Lock()
	total := p.prune.total
	p.prune.mu.Unlock()
	if total != 13 {
		t.Errorf("pruner counts %d in flight, want own 1 + peers' 12", total)
	}
	// 13 heard from three replicas, and the fourth as their mean
	if got, want := p.fleetInFlight(total, bs, now), int64(17); got != want {
		t.Errorf("two of three peers: fleet in flight %d, want %d", got, want)
	}
	report(0, 9, 0)
	if got := least(); len(got) != 1 || got[0] == 1 {
		t.Errorf("a new round, peers busy on b: least loaded %v, want a or c", got)
	}
	push := func(i int, requests int64) {
		bs[i].SetPeerLoad(&fleet.PeerLoad{Load: fleet.Load{Requests: requests}, Peers: 2, At: now})
	}
	push(0, 6)
	push(2, 8)
	push(1, 0)
	if got := least(); len(got) != 1 || got[0] != 1 {
		t.Errorf("pushed: a 6, b own 1, c 8: least loaded %v, want b", got)
	}
}

// With the engines' KV events, a replica places a request it has no
// session for with the backend holding most of its prompt when that one is
// within the placement slack, whatever the hash says (a conversation's
// next turn reaching another replica stays with its cache); a backend
// holding only a little more than the cheapest (a shared first block)
// does not outweigh the hash; and none beyond the slack is taken.
func TestPlacementFollowsEvents(t *testing.T) {
	p := New(nil, Config{Replicas: 2, Events: &heldBy{}})
	cands := []*fleet.Backend{fleet.NewBackend(0, "a", nil), fleet.NewBackend(1, "b", nil)}
	for _, tc := range []struct {
		name string
		cand []candidate
		want int // -1: both, by the hash
	}{
		{"holder within the slack", []candidate{{cost: 0.3, miss: 1000}, {cost: 0.4, cached: 900, miss: 100}}, 1},
		{"a shared first block", []candidate{{cost: 0.3, miss: 1000}, {cost: 0.35, cached: 100, miss: 900}}, -1},
		{"holder beyond the slack", []candidate{{cost: 0.3, miss: 1000}, {cost: 0.6, cached: 900, miss: 100}}, 0},
		// Once this replica has seen no session come back, a prompt
		// nobody holds goes to the cheapest, short of a near-tie.
		{"one-request sessions", []candidate{{cost: 0.3, miss: 1000}, {cost: 0.35, cached: 100, miss: 900}}, 0},
		{"one-request sessions, holder", []candidate{{cost: 0.3, miss: 1000}, {cost: 0.4, cached: 900, miss: 100}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.HasPrefix(tc.name, "one-request") {
				for i := range 300 {
					p.returns.place(uint64(i)|1, false, p.cfg.Replicas)
				}
			}
			checkPlaced(t, p, tc.cand, cands, tc.want)
		})
	}
}

// A replica learns whether sessions come back: traffic whose sessions it
// never sees twice (one-request sessions) stops counting as conversations
// within a few hundred requests, while conversations whose turns are
// split over 8 replicas, a quarter of them reaching one that routed their
// session before, keep counting; so do a run's first requests.
func TestReturningSessions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		every  int // every every-th request continues a session here; 0: none
		n      int
		want   bool
		placed int // requests placed by key
	}{
		{"fresh", 0, 0, true, 0},
		{"a first burst of new sessions", 0, 40, true, 40},
		{"one-request sessions", 0, 200, false, 200},
		{"conversations", 4, 400, true, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r returning
			placed := 0
			for i := range tc.n {
				if r.place(uint64(i)|1, tc.every > 0 && i%tc.every == 0, 8) {
					placed++
				}
			}
			if r.place(0, false, 8) {
				t.Error("placed a request without a key")
			}
			if got := r.conversations(8); got != tc.want {
				t.Errorf("conversations = %v after %d requests (share %.3f), want %v", got, tc.n, r.seen, tc.want)
			}
			if placed != tc.placed {
				t.Errorf("%d placed by key, want %d", placed, tc.placed)
			}
		})
	}
}

// checkPlaced places cand over 32 keys: want < 0 expects both of two
// candidates to be chosen for some key, else only candidate want.
func checkPlaced(t *testing.T, p *Policy, cand []candidate, cands []*fleet.Backend, want int) {
	t.Helper()
	picks := map[int]bool{}
	for key := uint64(1); key < 64; key += 2 {
		picks[p.placeByKey(cand, cands, 0, key)] = true
	}
	switch {
	case want < 0 && len(picks) != 2:
		t.Errorf("placed on %v over 32 keys, want both", picks)
	case want >= 0 && (len(picks) != 1 || !picks[want]):
		t.Errorf("placed on %v over 32 keys, want only %d", picks, want)
	}
}

// A replica that reads the engines' KV events and is told the other
// replicas' counts reach it before every pick (PeersExact) decides as one
// router: with the peers' reports in hand (here, all idle), it makes one
// router's decisions request for request. Told less, it places the
// sessions it has not seen by hash instead, and decides otherwise.
func TestExactPeersDecideAsOne(t *testing.T) {
	now := time.Unix(100, 0)
	clock := func() time.Time { return now }
	route := func(cfg Config, peers bool) []string {
		var bs []*fleet.Backend
		for i := range 6 {
			b := fleet.NewBackend(i, string(rune('a'+i)), nil)
			if peers {
				b.SetPeerLoad(&fleet.PeerLoad{Peers: cfg.Replicas - 1, At: now})
			}
			bs = append(bs, b)
		}
		cfg.Events = &heldBy{prompt: strings.Repeat("held ", 800), backend: 4}
		r, err := newRouter(bs, 3, clock, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for i := range 24 {
			prompt := strings.Repeat("word ", 200*(1+i%5)) + strings.Repeat("x", i)
			if i%6 == 5 {
				prompt = strings.Repeat("held ", 800)
			}
			tk, err := r.Route(&router.Request{Prompt: prompt, SessionKey: string(rune('A' + i)), MaxTokens: 50 + 40*(i%3)}, bs)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, tk.Decision.Backend.Name)
		}
		return got
	}
	one := route(Config{}, false)
	for _, tc := range []struct {
		name  string
		cfg   Config
		asOne bool
	}{
		{"counts exact, events", Config{Replicas: 8, PeersExact: true}, true},
		{"counts a poll old, events", Config{Replicas: 8}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := route(tc.cfg, true)
			t.Logf("one router %v, replica %v", one, got)
			same := strings.Join(got, ",") == strings.Join(one, ",")
			if same != tc.asOne {
				t.Errorf("one router: %v\nreplica:    %v\nsame: %v, want %v", one, got, same, tc.asOne)
			}
		})
	}
	// Without events a replica's index knows only its own placements: told
	// the counts are exact, it still places by hash.
	p := New(nil, Config{Replicas: 8, PeersExact: true})
	if p.asOne(time.Now()) {
		t.Error("exact counts without events: decides as one router, want placement by hash")
	}
}

// Behind pushed counts a replica with events decides as one router, but
// not in a burst: from two of its own picks less than the push delay apart
// until burstHold passes without another such pair, the others' picks of
// the same burst cannot have reached it.
func TestPushedCountsDecideAsOneButInABurst(t *testing.T) {
	p := New(nil, Config{Replicas: 4, Events: &heldBy{}, PeerPush: time.Millisecond})
	t0 := p.epoch.Add(time.Minute)
	for _, step := range []struct {
		at   time.Duration
		want bool
	}{
		{0, true},                      // a first pick
		{100 * time.Millisecond, true}, // far from the last
		{100*time.Millisecond + 200*time.Microsecond, false}, // a burst
		{300 * time.Millisecond, false},                      // still within burstHold of it
		{100*time.Millisecond + burstHold + time.Millisecond, true},
	} {
		if got := p.asOne(t0.Add(step.at)); got != step.want {
			t.Errorf("pick at +%v: as one router %v, want %v", step.at, got, step.want)
		}
	}
	// While some peer is polled, its counts are a poll old: as a replica.
	polled := New(nil, Config{Replicas: 4, Events: &heldBy{}, PeerPush: time.Millisecond,
		PeersPushed: func() bool { return false }})
	if polled.asOne(t0) {
		t.Error("a peer polled: decides as one router")
	}
	// Without pushed counts a replica never decides as one router.
	q := New(nil, Config{Replicas: 4, Events: &heldBy{}})
	if q.asOne(t0) {
		t.Error("counts neither exact nor pushed: decides as one router")
	}
}

// In a burst behind pushed counts, each replica keeps its picks to a lane
// of its own, the servers whose place in the order of their addresses is,
// modulo the replicas, its place among their names: two replicas routing
// a burst at one instant, each unaware of the other's picks, share no
// server. Only a server holding much more of a prompt than any in the
// lane draws it out.
func TestBurstKeepsToItsLane(t *testing.T) {
	now := time.Unix(100, 0)
	clock := func() time.Time { return now }
	held := strings.Repeat("held ", 800)
	route := func(self, other string, holder int) (lane, picked []int) {
		var bs []*fleet.Backend
		for i := range 8 {
			bs = append(bs, fleet.NewBackend(i, fmt.Sprintf("gpu%d", i), nil))
		}
		p := New(bs, Config{Replicas: 2, Now: clock, PeerPush: time.Millisecond, Seed: 1,
			Events: &heldBy{prompt: held, backend: holder},
			Lanes:  func() (string, []string) { return self, []string{other} }})
		rank := 0
		if other < self {
			rank = 1
		}
		for _, b := range bs {
			if int((*p.lanePos.Load())[b.Index])%2 == rank {
				lane = append(lane, b.Index)
			}
		}
		for i := range 6 {
			d, err := p.Pick(&router.Request{Prompt: strings.Repeat("word ", 300*(1+i%3)) + fmt.Sprint(i), SessionKey: self + fmt.Sprint(i), MaxTokens: 50}, bs)
			if err != nil {
				t.Fatal(err)
			}
			picked = append(picked, d.Backend.Index)
		}
		d, err := p.Pick(&router.Request{Prompt: held, SessionKey: self + "held", MaxTokens: 50}, bs)
		if err != nil {
			t.Fatal(err)
		}
		return lane, append(picked, d.Backend.Index)
	}
	laneA, _ := route("a", "b", 0)
	holder := slices.IndexFunc([]int{0, 1, 2, 3, 4, 5, 6, 7}, func(i int) bool { return !slices.Contains(laneA, i) })
	laneA, a := route("a", "b", holder)
	laneB, b := route("b", "a", holder)
	t.Logf("lanes %v and %v; picks %v and %v; the held prompt on %d", laneA, laneB, a, b, holder)
	if len(laneA) != 4 || len(laneB) != 4 || slices.ContainsFunc(laneA, func(i int) bool { return slices.Contains(laneB, i) }) {
		t.Fatalf("lanes %v and %v: want two halves", laneA, laneB)
	}
	// A replica's first pick keeps to its lane too (burstWatch.pick).
	for i, x := range a[:6] {
		if !slices.Contains(laneA, x) {
			t.Errorf("replica a's pick %d of the burst on %d, outside its lane %v", i, x, laneA)
		}
	}
	for i, x := range b[:6] {
		if !slices.Contains(laneB, x) {
			t.Errorf("replica b's pick %d of the burst on %d, outside its lane %v", i, x, laneB)
		}
	}
	if a[6] != holder {
		t.Errorf("replica a sent the prompt that %d holds to %d", holder, a[6])
	}
}

// A replica cannot tell a burst's first pick from a lone one; once most
// of its picks come in bursts it keeps every pick to its lane, as it does
// its very first pick, and a replica whose picks come one at a time
// leaves the lane from its second on.
func TestBurstyTrafficKeepsToTheLane(t *testing.T) {
	lanes := func() (string, []string) { return "a", []string{"b"} }
	p := New(nil, Config{Replicas: 2, Events: &heldBy{}, PeerPush: time.Millisecond, Lanes: lanes})
	at := p.epoch.Add(time.Minute)
	for range 40 { // bursts of four picks at one instant, a second apart
		for range 4 {
			p.mode(at)
		}
		at = at.Add(time.Second)
	}
	if one, lane := p.mode(at); one || !lane {
		t.Errorf("a burst's first pick after forty bursts: as one router %v, in its lane %v; want in its lane", one, lane)
	}
	q := New(nil, Config{Replicas: 2, Events: &heldBy{}, PeerPush: time.Millisecond, Lanes: lanes})
	at = q.epoch.Add(time.Minute)
	if one, lane := q.mode(at); one || !lane {
		t.Errorf("a replica's first pick: as one router %v, in its lane %v; want in its lane", one, lane)
	}
	for range 160 {
		at = at.Add(10 * time.Millisecond)
		if one, lane := q.mode(at); !one || lane {
			t.Fatalf("picks 10 ms apart: as one router %v, in its lane %v; want as one router", one, lane)
		}
	}
}

// In a burst a pruned pick looks for the least loaded within its lane:
// among the fleet's least loaded it would find few of its own.
func TestPrunerLeastKeepsToTheLane(t *testing.T) {
	bs := []*fleet.Backend{fleet.NewBackend(0, "a", nil), fleet.NewBackend(1, "b", nil), fleet.NewBackend(2, "c", nil), fleet.NewBackend(3, "d", nil)}
	p := New(bs, Config{})
	bs[1].Start(10, 10)
	bs[3].Start(10, 10)
	p.prune.mu.Lock()
	defer p.prune.mu.Unlock()
	at := p.prune.positions("", bs)
	if got := p.prune.least(nil, bs, at, lane{}, 2); !slices.Equal(got, []int32{0, 2}) {
		t.Errorf("no lane: least loaded %v, want the idle a and c", got)
	}
	odd := lane{pos: []int32{0, 1, 2, 3}, rank: 1, of: 2}
	if got := p.prune.least(nil, bs, at, odd, 2); !slices.Equal(got, []int32{1, 3}) {
		t.Errorf("lane of b and d: least loaded %v, want b and d", got)
	}
}

// newRouter returns a Router driving the policy as policies.New builds it
// for kvroute with seed and clock now (which this package cannot import).
func newRouter(bs []*fleet.Backend, seed uint64, now func() time.Time, cfg Config) (*router.Router, error) {
	cfg.Seed = cmp.Or(cfg.Seed, seed)
	if cfg.Now == nil {
		cfg.Now = now
	}
	cfg.Tokens = router.NewTokens()
	return router.NewPinningRouter(New(bs, cfg), cfg.Tokens, 0), nil
}
