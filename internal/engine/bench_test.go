package engine

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/shareddata/sharedtest"
	"github.com/kvroute/kvroute/internal/workload"
)

var sinkStats Stats

// BenchmarkEngineMooncake replays the Mooncake conversation trace (12,031
// requests, prompts of 12k tokens on average) through one default server in
// virtual time, with arrivals stretched to 3 requests/s, and reports how many
// times faster than real time the model runs.
func BenchmarkEngineMooncake(b *testing.B) {
	trace, err := workload.LoadMooncake(sharedtest.Require(b, "mooncake/conversation_trace.jsonl"))
	if err != nil {
		b.Fatal(err)
	}
	p, err := LookupProfile(DefaultProfile)
	if err != nil {
		b.Fatal(err)
	}
	// The trace runs at 3.4 requests/s; stretch it to 3.0.
	last := trace[len(trace)-1].Arrival
	stretch := float64(len(trace)) / last.Seconds() / 3.0
	reqs := make([]Request, len(trace))
	for i, tr := range trace {
		reqs[i] = Request{
			ID:          uint64(i),
			PromptLen:   tr.InputTokens,
			MaxTokens:   max(tr.OutputTokens, 1),
			BlockHashes: HashBlockIDs(nil, tr.HashIDs, workload.MooncakeBlockTokens, tr.InputTokens, p.BlockSize),
		}
	}
	arrival := func(i int) time.Duration { return time.Duration(float64(trace[i].Arrival) * stretch) }

	b.ReportAllocs()
	b.ResetTimer()
	var model time.Duration
	for b.Loop() {
		e, err := New(p)
		if err != nil {
			b.Fatal(err)
		}
		now, next := time.Duration(0), 0
		for next < len(reqs) || e.HasWork() {
			// Admit everything that arrived before the next step starts.
			for next < len(reqs) && (arrival(next) <= now || !e.HasWork()) {
				now = max(now, arrival(next))
				r := reqs[next] // a fresh copy for every run
				if err := e.Add(arrival(next), &r); err != nil {
					b.Fatal(err)
				}
				next++
			}
			now = e.Step(now).End
		}
		model += now
		sinkStats = e.Stats()
	}
	b.StopTimer()
	b.ReportMetric(model.Seconds()/b.Elapsed().Seconds(), "x-realtime")
	s := sinkStats
	b.ReportMetric(float64(s.PrefixHits)/float64(s.PrefixQueries)*100, "%hit")
	b.ReportMetric(float64(s.BusyTime)/float64(model/time.Duration(b.N))*100, "%busy")
}

// BenchmarkStep measures one step of a server with a full batch: 256
// requests decoding, each replaced by a new one (whose prefill then joins the
// batch) when it finishes.
func BenchmarkStep(b *testing.B) {
	p, err := LookupProfile(DefaultProfile)
	if err != nil {
		b.Fatal(err)
	}
	e, err := New(p)
	if err != nil {
		b.Fatal(err)
	}
	id := uint64(0)
	add := func(now time.Duration) {
		id++
		if err := e.Add(now, &Request{ID: id, PromptLen: 500, MaxTokens: 500}); err != nil {
			b.Fatal(err)
		}
	}
	for range p.MaxNumSeqs {
		add(0)
	}
	now := time.Duration(0)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		res := e.Step(now)
		now = res.End
		for _, r := range res.Tokens {
			if r.Done() {
				add(now)
			}
		}
	}
}
