package fleet

import (
	"fmt"
	"net/http"
	"strconv"

	dto "github.com/prometheus/client_model/go"
)

// HeaderDataParallelRank is the request header vLLM reads a request's
// data-parallel rank from.
const HeaderDataParallelRank = "X-data-parallel-rank"

// ExpandRanks returns b as ranks backends, one per data-parallel rank of
// the server behind b.URL, named NAME/dpRANK, indexed from b.Index on, each
// its own cache domain and load; ranks ≤ 1 returns b alone.
func ExpandRanks(b *Backend, ranks int) ([]*Backend, error) {
	if ranks < 0 || ranks > maxRanks {
		return nil, fmt.Errorf("%w: backend %s: %d data-parallel ranks, want 1 to %d", ErrInvalidBackend, b.Name, ranks, maxRanks)
	}
	if ranks <= 1 {
		return []*Backend{b}, nil
	}
	out := make([]*Backend, ranks)
	for r := range ranks {
		rb := NewBackend(b.Index+r, b.Name+"/dp"+strconv.Itoa(r), b.URL)
		rb.APIKey, rb.Labels, rb.GPUMetricsURL, rb.GPUPod = b.APIKey, b.Labels, b.GPUMetricsURL, b.GPUPod
		rb.Rank, rb.Ranks = r, ranks
		out[r] = rb
	}
	return out, nil
}

// maxRanks bounds a server's data-parallel ranks: vLLM's largest
// deployments run tens.
const maxRanks = 1024

// setRank names b's rank in a request's headers, when b is a rank.
func (b *Backend) setRank(h http.Header) {
	if b.Ranks > 1 {
		h.Set(HeaderDataParallelRank, strconv.Itoa(b.Rank))
	}
}

// endpoint is what tells b's server apart from the others': its URL, and
// its rank when it is one.
func endpoint(b *Backend) string {
	if b.Ranks > 1 {
		return b.URL.String() + "#dp" + strconv.Itoa(b.Rank)
	}
	return b.URL.String()
}

// engineLabel is the engine label of b's metrics, when b is a rank.
func engineLabel(b *Backend) string {
	if b.Ranks > 1 {
		return strconv.Itoa(b.Rank)
	}
	return ""
}

// engineOnly keeps, in every family that labels its series by engine,
// only the series of engine; nothing changes when engine is empty.
func engineOnly(fams map[string]*dto.MetricFamily, engine string) {
	if engine == "" {
		return
	}
	for _, f := range fams {
		kept := f.Metric[:0]
		labelled := false
		for _, m := range f.Metric {
			for _, l := range m.GetLabel() {
				if l.GetName() == "engine" {
					labelled = true
					if l.GetValue() == engine {
						kept = append(kept, m)
					}
					break
				}
			}
		}
		if labelled {
			f.Metric = kept
		}
	}
}

// engineCount returns how many data-parallel engines a family's series
// name (their engine labels), 0 when they name none.
func engineCount(mf *dto.MetricFamily) int {
	seen := map[string]bool{}
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "engine" {
				seen[l.GetValue()] = true
			}
		}
	}
	return len(seen)
}

// noteEngines warns, once per backend, when a backend that is no rank
// serves several data-parallel engines: routed as one, its engines' caches
// look like one, and the prefix kvroute predicts is on whichever engine
// the server picks.
func (f *Fleet) noteEngines(m *member, engines int) {
	if engines <= 1 || m.b.Ranks > 1 || m.enginesNoted {
		return
	}
	m.enginesNoted = true
	f.log.Warn("backend serves several data-parallel engines; route to each with --dp-ranks (dp_ranks in --config)",
		"backend", m.b.Name, "engines", engines, "flag", fmt.Sprintf("--dp-ranks %s=%d", m.b.Name, engines))
}
