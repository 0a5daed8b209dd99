package sim

import (
	"time"

	"github.com/kvroute/kvroute/internal/results"
)

// report builds the run's measurements.
func (s *simulation) report(policy string) *results.Run {
	run := &results.Run{Policy: policy, Requests: s.kept}
	run.Summary = s.sum.Summary(policy)
	busy := make([]time.Duration, len(s.servers))
	run.Backends = make([]results.BackendSeries, len(s.servers))
	for i := range s.servers {
		st := s.servers[i].eng.Stats()
		busy[i] = st.BusyTime
		run.Summary.AdapterLoads += st.LoRALoads
		run.Backends[i] = results.BackendSeries{
			Name: s.cfg.serverName(i), Busy: st.BusyTime,
			PromptTokens: st.PrefixQueries, CachedTokens: st.PrefixHits,
			Samples: s.servers[i].samples,
		}
	}
	run.Summary.Imbalance = results.Imbalance(busy)
	trimSamples(run.Backends, maxSampledBackends)
	return run
}

// maxSampledBackends bounds the backends whose load over time a report
// keeps: a chart of a thousand lines shows nothing, and the JSON would be
// large.
const maxSampledBackends = 32

// trimSamples keeps the samples of at most keep backends: the busiest half
// and the least busy half, which show the spread.
func trimSamples(bs []results.BackendSeries, keep int) {
	if len(bs) <= keep {
		return
	}
	idx := make([]int, len(bs))
	for i := range idx {
		idx[i] = i
	}
	sortByBusy(idx, bs)
	keepSet := make(map[int]bool, keep)
	for k := range keep / 2 {
		keepSet[idx[k]] = true
		keepSet[idx[len(idx)-1-k]] = true
	}
	for i := range bs {
		if !keepSet[i] {
			bs[i].Samples = nil
		}
	}
}

// sampleResults keeps at most keep results, evenly spaced, in order.
func sampleResults(rs []results.Result, keep int) []results.Result {
	if keep < 0 || len(rs) <= keep {
		return rs
	}
	out := make([]results.Result, keep)
	for i := range out {
		out[i] = rs[i*len(rs)/keep]
	}
	return out
}
