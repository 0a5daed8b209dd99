package results

import (
	"errors"
	"testing"
	"time"
)

func TestParseSLO(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    SLO
		wantErr bool
	}{
		{"ttft=2s,tpot=50ms", SLO{TTFT: 2 * time.Second, TPOT: 50 * time.Millisecond}, false},
		{"tpot=20ms", SLO{TPOT: 20 * time.Millisecond}, false},
		{"ttft=2s,", SLO{}, true},
		{"ttft=-1s", SLO{}, true},
		{"latency=2s", SLO{}, true},
		{"2s", SLO{}, true},
	} {
		got, err := ParseSLO(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("%q: %+v, %v; want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestApplySLO(t *testing.T) {
	ms := time.Millisecond
	rs := []Result{
		{TTFT: 100 * ms, ITL: 10 * ms, E2E: time.Second},                  // meets both
		{TTFT: 3 * time.Second, ITL: 10 * ms, E2E: 4 * time.Second},       // TTFT over
		{TTFT: 100 * ms, ITL: 80 * ms, E2E: 2 * time.Second},              // TPOT over
		{TTFT: 3 * time.Second, ITL: 80 * ms, E2E: 4 * time.Second},       // both over
		{Status: 503, Err: errors.New("no backend"), Error: "no backend"}, // failed
	}
	sum := Summarize("p", rs)
	sum.ApplySLO(rs, SLO{TTFT: 2 * time.Second, TPOT: 50 * time.Millisecond})
	g := sum.SLO
	if g == nil || g.Met != 1 || g.Goodput != 0.2 || g.TTFTMissed != 0.4 || g.TPOTMissed != 0.4 || g.Rejected != 0.2 {
		t.Fatalf("%+v", g)
	}
	if want := 1 / sum.Span.Seconds(); g.GoodputRate != want {
		t.Errorf("rate %v, want %v", g.GoodputRate, want)
	}
	var none Summary
	none.ApplySLO(rs, SLO{})
	if none.SLO != nil {
		t.Error("a zero objective reported")
	}
}

// A Summarizer told the objective and the block size gives, one result at a
// time, what ApplySLO and PredictionAccuracy give from all of them: the
// simulator keeps only a sample of its results.
func TestSummarizerCountsLikeTheSlices(t *testing.T) {
	ms := time.Millisecond
	rs := []Result{
		{Status: 200, TTFT: 100 * ms, ITL: 10 * ms, E2E: time.Second, PredictedCached: 40, CachedTokens: 47},
		{Status: 200, TTFT: 3 * time.Second, ITL: 10 * ms, E2E: 4 * time.Second, PredictedCached: 16, CachedTokens: 48},
		{Status: 200, TTFT: 100 * ms, ITL: 80 * ms, E2E: 2 * time.Second, Sent: time.Second},
		{Status: 503, Err: errors.New("no backend"), Error: "no backend"},
	}
	slo := SLO{TTFT: 2 * time.Second, TPOT: 50 * time.Millisecond}
	want := Summarize("p", rs)
	want.ApplySLO(rs, slo)
	want.PredictionAccuracy = PredictionAccuracy(rs, 16)
	a := Summarizer{BlockSize: 16, SLO: slo}
	for i := range rs {
		a.Add(&rs[i])
	}
	got := a.Summary("p")
	if got.PredictionAccuracy != want.PredictionAccuracy || want.PredictionAccuracy != 2.0/3 {
		t.Errorf("prediction accuracy %v, want %v (2/3)", got.PredictionAccuracy, want.PredictionAccuracy)
	}
	if got.SLO == nil || *got.SLO != *want.SLO {
		t.Errorf("SLO %+v, want %+v", got.SLO, want.SLO)
	}
	var none Summarizer
	none.Add(&rs[0])
	if s := none.Summary("p"); s.SLO != nil || s.PredictionAccuracy != 0 {
		t.Errorf("without an objective or a block size: %+v", s)
	}
}
