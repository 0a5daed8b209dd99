package router

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/prometheus/client_golang/prometheus"
)

// ReasonResponse is the Decision.Reason of a Responses API request sent to
// the backend that produced the response its previous_response_id names.
const ReasonResponse = "response"

// DefaultResponsePins is how many response ids a router remembers the
// backend of (policies.Options.ResponsePins). An id costs 32.5 bytes of heap (a
// 64-bit hash and a pointer in the map, 8 bytes in the ring; measured by
// BenchmarkPins), so the default holds 3.3 MB; at 100 responses a second
// it remembers the last quarter of an hour, longer than a user takes to
// answer, and vLLM keeps its stored responses in memory only (a restart
// loses them anyway).
const DefaultResponsePins = 100_000

// pins remembers which backend produced each response id the router saw
// go by (Outcome.ResponseID), so that a request continuing it
// (Request.PreviousResponseID) goes back there: the backend that stores a
// response is the only one that can continue it. It holds up to a fixed
// number of ids and forgets the oldest first: a conversation's newest
// response is always the youngest entry. Keys are 64-bit hashes of the
// ids; a collision (odds 1 in 10^9 at capacity) sends a request to a
// backend that answers it does not know the response. Safe for concurrent
// use; a nil *pins remembers nothing.
type pins struct {
	mu   sync.Mutex
	byID map[uint64]*fleet.Backend
	ring []uint64 // ids in the order learned; the oldest at next once full
	next int
	size int

	pinned, gone, unknown, learned atomic.Uint64
}

// newPins returns pins holding up to size ids (0: DefaultResponsePins;
// negative: nil, none).
func newPins(size int) *pins {
	if size < 0 {
		return nil
	}
	if size == 0 {
		size = DefaultResponsePins
	}
	return &pins{byID: make(map[uint64]*fleet.Backend), size: size}
}

// learn notes that backend b produced the response id.
func (p *pins) learn(id string, b *fleet.Backend) {
	if p == nil || id == "" {
		return
	}
	h := xxhash.Sum64String(id)
	p.learned.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.byID[h]; ok {
		p.byID[h] = b
		return
	}
	if len(p.ring) < p.size {
		p.ring = append(p.ring, h)
	} else {
		delete(p.byID, p.ring[p.next])
		p.ring[p.next] = h
		p.next = (p.next + 1) % p.size
	}
	p.byID[h] = b
}

// narrow returns the candidates a request continuing the response id may
// go to: the backend that produced it alone, when it is a candidate
// (healthy, not ejected, serving the model); otherwise all of cands, for
// the policy to route as any request, and that backend, if any, answers
// with its own error. pinned reports the first case.
func (p *pins) narrow(id string, cands []*fleet.Backend) (_ []*fleet.Backend, pinned bool) {
	if p == nil || id == "" {
		return cands, false
	}
	b, ok := p.lookup(id)
	switch {
	case !ok:
		p.unknown.Add(1)
		return cands, false
	case !slices.Contains(cands, b):
		p.gone.Add(1)
		return cands, false
	}
	p.pinned.Add(1)
	return []*fleet.Backend{b}, true
}

// lookup returns the backend that produced the response id, if known.
func (p *pins) lookup(id string) (*fleet.Backend, bool) {
	if p == nil || id == "" {
		return nil, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.byID[xxhash.Sum64String(id)]
	return b, ok
}

// ResponseBackend returns the backend that produced the Responses API
// response id, as the router learned it, or nil if it does not know: the
// one backend that can answer a request about a stored response (GET
// /v1/responses/{id}, its cancel and input items). Counted in no metric.
// Safe for concurrent use.
func (r *Router) ResponseBackend(id string) *fleet.Backend {
	b, _ := r.pins.lookup(id)
	return b
}

// entries is the number of ids held.
func (p *pins) entries() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byID)
}

// PinStats counts what the router's response pinning did: requests with
// a previous_response_id sent to the backend that produced it (Pinned),
// whose backend was not a candidate (Gone), whose id was not known
// (Unknown); ids learned from responses (Learned) and held (Entries).
type PinStats struct {
	Pinned, Gone, Unknown, Learned uint64
	Entries                        int
}

// PinStats returns the counts of the router's response pinning (all zero
// when it keeps no pins). Safe for concurrent use.
func (r *Router) PinStats() PinStats { return r.pins.stats() }

func (p *pins) stats() PinStats {
	if p == nil {
		return PinStats{}
	}
	return PinStats{Pinned: p.pinned.Load(), Gone: p.gone.Load(), Unknown: p.unknown.Load(),
		Learned: p.learned.Load(), Entries: p.entries()}
}

var (
	pinRequestsDesc = prometheus.NewDesc("kvroute_response_pins_total",
		`Responses API requests with a previous_response_id, by what the router did: "pinned" (sent to the backend that produced that response), "gone" (that backend is not a candidate now: removed, unhealthy, ejected; routed as any request) or "unknown" (an id the router did not see or has forgotten; routed as any request).`,
		[]string{"result"}, nil)
	pinEntriesDesc = prometheus.NewDesc("kvroute_response_pin_entries",
		"Response ids whose backend the router remembers (at most --response-pins).", nil, nil)
	pinLearnedDesc = prometheus.NewDesc("kvroute_response_pins_learned_total",
		"Response ids learned from the responses the router forwarded.", nil, nil)
)

type pinCollector struct{ p *pins }

// Describe implements prometheus.Collector.
func (c pinCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pinRequestsDesc
	ch <- pinEntriesDesc
	ch <- pinLearnedDesc
}

// Collect implements prometheus.Collector.
func (c pinCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.p.stats()
	for _, r := range []struct {
		label string
		n     uint64
	}{{"pinned", st.Pinned}, {"gone", st.Gone}, {"unknown", st.Unknown}} {
		ch <- prometheus.MustNewConstMetric(pinRequestsDesc, prometheus.CounterValue, float64(r.n), r.label)
	}
	ch <- prometheus.MustNewConstMetric(pinEntriesDesc, prometheus.GaugeValue, float64(st.Entries))
	ch <- prometheus.MustNewConstMetric(pinLearnedDesc, prometheus.CounterValue, float64(st.Learned))
}
