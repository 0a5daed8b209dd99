package sim

import (
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/results"
)

// scrape copies every server's metrics into replica r's view, as a scrape
// of /metrics would, with its GPU's utilisation since the last scrape, as
// a DCGM exporter reports it beside the engine.
func (s *simulation) scrape(r int) {
	rep := s.replicas[r]
	at := s.clock()
	for i := range s.servers {
		s.servers[i].eng.Settle(s.now)
		st := s.servers[i].eng.Stats()
		gpu := -1.0 // not known before a second scrape
		if span := s.now - rep.scraped[i]; rep.scrapedOnce && span > 0 {
			gpu = min(1, float64(st.BusyTime-rep.busy[i])/float64(span))
		}
		rep.metrics[i] = fleet.Metrics{
			Running: float64(st.Running), Waiting: float64(st.Waiting), KVUsage: st.KVUsage,
			PrefixHits: float64(st.PrefixHits), PrefixQueries: float64(st.PrefixQueries),
			GPUUtil: gpu, SMActive: -1, At: at,
			LoRA: s.adapters.info(s.servers[i].eng),
		}
		rep.scraped[i], rep.busy[i] = s.now, st.BusyTime
	}
	rep.scrapedOnce = true
}

// gossip gives every replica the sum of the others' in-flight counts on
// each server, as a round of polls of internal/peers would.
func (s *simulation) gossip() {
	at := s.clock()
	peers := len(s.replicas) - 1
	for i := range s.servers {
		var total fleet.Load
		for _, rep := range s.replicas {
			total = total.Plus(rep.backends[i].Load())
		}
		for _, rep := range s.replicas {
			others := total.Minus(rep.backends[i].Load())
			rep.backends[i].SetPeerLoad(&fleet.PeerLoad{Load: others, Peers: peers, At: at})
		}
	}
	if s.push != nil {
		s.push.polled()
	}
}

// sample records every server's load. Past sampleCap samples a server, it
// keeps every other one and samples half as often from then on: a long run
// at ten thousand servers would otherwise keep gigabytes of samples for a
// chart of a few hundred points. The cap is even, so the sample just taken
// (at an even position) is kept and the grid stays regular.
func (s *simulation) sample() {
	for i := range s.servers {
		s.servers[i].eng.Settle(s.now)
		st := s.servers[i].eng.Stats()
		s.servers[i].samples = append(s.servers[i].samples, results.LoadSample{At: s.now, Running: st.Running, Waiting: st.Waiting, KVUsage: st.KVUsage})
	}
	if len(s.servers[0].samples) <= s.sampleCap {
		return
	}
	for i := range s.servers {
		ss := s.servers[i].samples
		for j := 0; 2*j < len(ss); j++ {
			ss[j] = ss[2*j]
		}
		s.servers[i].samples = ss[:(len(ss)+1)/2]
	}
	s.sampleEvery *= 2
}

// The load samples of all servers together stay under about sampleBudget
// (32 bytes each), and each server keeps at least minSamples.
const (
	sampleBudget = 4 << 20
	minSamples   = 256
)
