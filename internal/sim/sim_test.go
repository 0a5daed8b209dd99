package sim

import (
	"context"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

func profile(t testing.TB) engine.Profile {
	t.Helper()
	p, err := engine.LookupProfile(engine.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The queue pops events by time, and in push order among equal times.
func TestQueueOrder(t *testing.T) {
	var q queue
	rng := rand.New(rand.NewPCG(1, 2))
	type key struct {
		at  time.Duration
		idx int32
	}
	var want []key
	for i := range 2000 {
		at := time.Duration(rng.IntN(50))
		q.push(at, evSend, int32(i))
		want = append(want, key{at, int32(i)})
	}
	slices.SortStableFunc(want, func(a, b key) int { return int(a.at - b.at) })
	for i, w := range want {
		ev := q.pop()
		if ev.at != w.at || ev.idx != w.idx {
			t.Fatalf("pop %d: (%v, %d), want (%v, %d)", i, ev.at, ev.idx, w.at, w.idx)
		}
	}
	if q.len() != 0 {
		t.Fatalf("%d events left", q.len())
	}
}

func chatWorkload(t testing.TB, sessions int) workload.Workload {
	t.Helper()
	cfg := workload.DemoChat()
	cfg.Sessions, cfg.Span = sessions, 20*time.Second
	return workload.Workload{Name: "chat", Sessions: workload.Chat(cfg, 1)}
}

// The same configuration gives the same results, request for request.
func TestDeterministic(t *testing.T) {
	cfg := Config{Workload: chatWorkload(t, 40), Backends: 3, Routers: 2, Profile: profile(t),
		Policies: []string{"kvroute", "llmd-default"}, Seed: 7}
	a, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.Runs {
		if !reflect.DeepEqual(a.Runs[i].Requests, b.Runs[i].Requests) {
			t.Errorf("%s: two runs differ", a.Runs[i].Policy)
		}
		if n := a.Runs[i].Summary.Requests; n != 240 || a.Runs[i].Summary.Errors != 0 {
			t.Errorf("%s: %d requests, %d errors; want 240, 0", a.Runs[i].Policy, n, a.Runs[i].Summary.Errors)
		}
	}
}
