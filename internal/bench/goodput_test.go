package bench

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// The goodput search doubles the arrival rate until the SLO breaks, then
// bisects; an SLO nothing can meet gives 0 after one trial, a lax one the
// highest rate tried.
func TestGoodputSearch(t *testing.T) {
	p, err := engine.LookupProfile(engine.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	var sessions []workload.Session
	for i := range 8 {
		sessions = append(sessions, workload.Session{ID: "s", Start: time.Duration(i) * time.Second,
			Turns: []workload.Turn{{User: "Hello there, how are you today?", MaxTokens: 4}}})
	}
	cfg := Config{Workload: workload.Workload{Sessions: sessions}, Backends: 1, Profile: p, TimeScale: 0.01, Seed: 1, Policies: []string{"round-robin"}}
	base := 8 / 7.0 // 8 requests over 7 s

	cfg.Goodput = time.Nanosecond
	g, err := searchGoodput(context.Background(), cfg, "round-robin")
	if err != nil {
		t.Fatal(err)
	}
	if g.Rate != 0 || len(g.Points) != 1 || g.Points[0].Met {
		t.Errorf("an impossible SLO: rate %v, points %+v", g.Rate, g.Points)
	}

	cfg.Goodput = time.Hour
	g, err = searchGoodput(context.Background(), cfg, "round-robin")
	if err != nil {
		t.Fatal(err)
	}
	if want := 64 * base; g.Rate < want*0.999 || g.Rate > want*1.001 {
		t.Errorf("a lax SLO: rate %.2f, want the highest tried, %.2f", g.Rate, want)
	}
	for _, pt := range g.Points {
		if !pt.Met || pt.TTFTP99 <= 0 {
			t.Errorf("point %+v", pt)
		}
	}
}
