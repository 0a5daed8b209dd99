package baseline

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/routertest"
)

func TestRandomCoversAllBackends(t *testing.T) {
	bs := routertest.Backends(4)
	p := NewRandom(1)
	seen := map[string]int{}
	for range 400 {
		d := routertest.Pick(t, p, &router.Request{}, bs)
		if d.Reason != "random" {
			t.Fatalf("reason %q", d.Reason)
		}
		seen[d.Backend.Name]++
	}
	for _, b := range bs {
		if seen[b.Name] < 60 {
			t.Errorf("%s got %d of 400: %v", b.Name, seen[b.Name], seen)
		}
	}
}

func TestP2CNeverPicksTheMoreLoadedOfItsTwo(t *testing.T) {
	bs := routertest.Backends(4)
	var flights [][]*fleet.Flight
	for i, b := range bs {
		flights = append(flights, routertest.Hold(b, i, 10, 100, false)) // b_i has i in flight
	}
	defer routertest.Release(flights...)
	p := NewP2C(1)
	seen := map[string]int{}
	for range 600 {
		d := routertest.Pick(t, p, &router.Request{}, bs)
		if len(d.Scores) != 2 || d.Scores[0].Backend == d.Scores[1].Backend {
			t.Fatalf("scores %+v: want two distinct candidates", d.Scores)
		}
		if d.Scores[0].Backend != d.Backend.Name || d.Scores[0].Cost > d.Scores[1].Cost {
			t.Fatalf("picked %s of %+v", d.Backend.Name, d.Scores)
		}
		seen[d.Backend.Name]++
	}
	if seen["b3"] != 0 {
		t.Errorf("the most loaded backend was picked %d times", seen["b3"])
	}
	// b0 wins every pair it is in (half of them), b1 the pair with b2 or b3, ...
	if seen["b0"] < 250 || seen["b1"] < 150 || seen["b2"] < 60 {
		t.Errorf("picks %v, want about 300/200/100/0", seen)
	}
	// Of two, always the lighter: the two draws are distinct.
	for range 50 {
		if d := routertest.Pick(t, p, &router.Request{}, bs[2:]); d.Backend != bs[2] {
			t.Fatalf("picked %s of b2 (2 in flight) and b3 (3)", d.Backend.Name)
		}
	}
}

func TestSessionBoundedKeepsSessionsWhileLoadAllows(t *testing.T) {
	bs := routertest.Backends(5)
	p := NewSessionBounded(bs, 1, Config{})
	plain := NewSessionHash(bs, 1)
	for i := range 200 {
		req := &router.Request{SessionKey: fmt.Sprintf("session-%d", i)}
		d := routertest.Pick(t, p, req, bs)
		if want := routertest.Pick(t, plain, req, bs).Backend; d.Backend != want || d.Reason != "session" {
			t.Fatalf("%s on %s (%s), want its ring owner %s", req.SessionKey, d.Backend.Name, d.Reason, want.Name)
		}
	}
	// Without a session key, the first 256 bytes of the prompt are the key.
	system := routertest.Words(0, 300)
	first := routertest.Pick(t, p, &router.Request{Prompt: system + routertest.Words(1, 500)}, bs)
	for i := range 20 {
		d := routertest.Pick(t, p, &router.Request{Prompt: system + routertest.Words(i+2, 500)}, bs)
		if d.Backend != first.Backend || d.Reason != "hash" {
			t.Fatalf("prompt %d on %s (%s), want %s like the others sharing its first block", i, d.Backend.Name, d.Reason, first.Backend.Name)
		}
	}
}

func TestSessionBoundedNeverExceedsBound(t *testing.T) {
	bs := routertest.Backends(5)
	p := NewSessionBounded(bs, 1, Config{Epsilon: 0.25})
	var flights []*fleet.Flight
	reasons := map[string]int{}
	for i := range 400 {
		var total int64
		for _, b := range bs {
			total += b.Load().Requests
		}
		bound := int64(math.Ceil(1.25 * float64(total+1) / 5))
		// Skewed: half the requests belong to one hot session.
		key := "hot"
		if i%2 == 1 {
			key = fmt.Sprintf("s%d", i%7)
		}
		d := routertest.Pick(t, p, &router.Request{SessionKey: key}, bs)
		if n := d.Backend.Load().Requests; n+1 > bound {
			t.Fatalf("request %d: %s had %d in flight, bound %d (total %d)", i, d.Backend.Name, n, bound, total)
		}
		reasons[d.Reason]++
		flights = append(flights, d.Backend.Start(10, 100))
		if i%3 == 2 { // one in three ends: the fleet fills up
			flights[0].Done()
			flights = flights[1:]
		}
	}
	for _, f := range flights {
		f.Done()
	}
	if reasons["spill"] == 0 || reasons["session"] == 0 {
		t.Errorf("reasons %v: the hot session must spill and the others stay", reasons)
	}
}

func TestRoundRobinCycles(t *testing.T) {
	bs := routertest.Backends(3)
	p := &RoundRobin{}
	var got []string
	for range 6 {
		got = append(got, routertest.Pick(t, p, &router.Request{}, bs).Backend.Name)
	}
	if want := "b0 b1 b2 b0 b1 b2"; strings.Join(got, " ") != want {
		t.Errorf("got %v, want %s", got, want)
	}
	if _, err := p.Pick(&router.Request{}, nil); err != router.ErrNoBackend {
		t.Errorf("no candidates: err = %v, want ErrNoBackend", err)
	}
}

func TestLeastRequestPicksFewestAndBreaksTiesRandomly(t *testing.T) {
	bs := routertest.Backends(4)
	p := NewLeastRequest(1)
	f := []*fleet.Flight{bs[0].Start(1, 1), bs[1].Start(1, 1), bs[3].Start(1, 1)}
	for range 10 {
		if d := routertest.Pick(t, p, &router.Request{}, bs); d.Backend != bs[2] {
			t.Fatalf("picked %s, want the idle b2", d.Backend.Name)
		}
	}
	for _, x := range f {
		x.Done()
	}
	seen := map[string]int{}
	for range 400 {
		seen[routertest.Pick(t, p, &router.Request{}, bs).Backend.Name]++
	}
	for _, b := range bs {
		if seen[b.Name] < 60 {
			t.Errorf("idle fleet: %s got %d of 400 picks; ties must break at random", b.Name, seen[b.Name])
		}
	}
}

func TestSessionHashIsStickyAndConsistent(t *testing.T) {
	bs := routertest.Backends(5)
	p := NewSessionHash(bs, 1)
	owner := map[string]*fleet.Backend{}
	for i := range 500 {
		key := fmt.Sprintf("session-%d", i)
		d := routertest.Pick(t, p, &router.Request{SessionKey: key}, bs)
		if again := routertest.Pick(t, p, &router.Request{SessionKey: key}, bs); again.Backend != d.Backend {
			t.Fatalf("%s moved from %s to %s", key, d.Backend.Name, again.Backend.Name)
		}
		owner[key] = d.Backend
	}
	// Without b2 only b2's sessions move.
	without := append(append([]*fleet.Backend{}, bs[:2]...), bs[3:]...)
	moved := 0
	for key, b := range owner {
		d := routertest.Pick(t, p, &router.Request{SessionKey: key}, without)
		if b != bs[2] && d.Backend != b {
			t.Fatalf("%s moved off %s although only b2 left", key, b.Name)
		}
		if b == bs[2] {
			moved++
		}
	}
	if moved < 50 || moved > 150 {
		t.Errorf("b2 owned %d of 500 sessions, want about 100", moved)
	}
}
