package router

import (
	"slices"
	"strconv"
	"strings"
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

	pinned, decoded, gone, unknown, learned atomic.Uint64
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
// with its own error. pinned reports the first case. The backend is the
// one remembered for the id or, when this router did not see the response
// go by (another replica did, or this one before a restart), the one the
// id names (MintResponseID).
func (p *pins) narrow(id string, cands []*fleet.Backend) (_ []*fleet.Backend, pinned bool) {
	if p == nil || id == "" {
		return cands, false
	}
	orig, tag, minted := parseResponseID(id)
	b, ok := p.lookup(orig)
	switch {
	case !ok && minted:
		if b = tagged(tag, cands); b == nil {
			p.gone.Add(1)
			return cands, false
		}
		p.decoded.Add(1)
		return []*fleet.Backend{b}, true
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

// Response ids that name their backend (decision 0019): a backend's id
// "resp_abc" reaches the client as "resp_abc_kvr" + 12 hex digits of the
// backend's tag + 8 of a check. The tag is a hash of the backend's URL,
// the one thing about a backend that every replica, before and after a
// restart, and every discovery agree on; the check, a hash of the id and
// the tag, tells an id kvroute minted from one that merely looks like it.
// The client cannot name an address: only a backend of the fleet whose
// tag matches can be chosen.
const (
	mintMark   = "_kvr"
	tagDigits  = 12 // 48 bits: the fleet's backends do not collide
	checkDigit = 8  // 32 bits: an id not minted passes as minted once in 4e9
	mintSuffix = len(mintMark) + tagDigits + checkDigit
)

// MintResponseID returns the Responses API response id the client is given
// for the id b produced: id with b's tag and a check appended, which any
// router of the fleet maps back to b and to id (Route, ResponseBackend,
// OriginalResponseID). It returns id itself when the router keeps no pins
// (--response-pins 0), when id is already minted, or when it holds a
// character other than ASCII letters, digits, '-', '_' and '.' (it would
// need escaping in JSON or in a URL path). Safe for concurrent use.
func (r *Router) MintResponseID(id string, b *fleet.Backend) string {
	if r.pins == nil || b == nil || b.URL == nil || !plainID(id) {
		return id
	}
	if _, _, minted := parseResponseID(id); minted {
		return id
	}
	return mintResponseID(id, backendTag(b))
}

// MintsResponseIDs reports whether the router maps response ids
// (MintResponseID): whether it keeps response pins.
func (r *Router) MintsResponseIDs() bool { return r.pins != nil }

func mintResponseID(id string, tag uint64) string {
	var b strings.Builder
	b.Grow(len(id) + mintSuffix)
	b.WriteString(id)
	b.WriteString(mintMark)
	writeHex(&b, tag, tagDigits)
	writeHex(&b, uint64(idCheck(id, tag)), checkDigit)
	return b.String()
}

// writeHex writes the low 4×digits bits of v as that many lower-case hex
// digits.
func writeHex(b *strings.Builder, v uint64, digits int) {
	const hex = "0123456789abcdef"
	for i := digits - 1; i >= 0; i-- {
		b.WriteByte(hex[(v>>(4*i))&0xf])
	}
}

// OriginalResponseID returns the id its backend gave a response whose id
// the client holds, and whether the client's id was minted
// (MintResponseID); an id kvroute did not mint is returned as it is.
func OriginalResponseID(id string) (string, bool) {
	orig, _, minted := parseResponseID(id)
	return orig, minted
}

// parseResponseID splits a minted id into the backend's id and the tag; an
// id not minted is orig itself, minted false.
func parseResponseID(id string) (orig string, tag uint64, minted bool) {
	n := len(id) - mintSuffix
	if n <= 0 || id[n:n+len(mintMark)] != mintMark {
		return id, 0, false
	}
	tag, err := strconv.ParseUint(id[n+len(mintMark):len(id)-checkDigit], 16, 64)
	if err != nil {
		return id, 0, false
	}
	check, err := strconv.ParseUint(id[len(id)-checkDigit:], 16, 32)
	if err != nil || uint32(check) != idCheck(id[:n], tag) || !isLowerHex(id[n+len(mintMark):]) {
		return id, 0, false
	}
	return id[:n], tag, true
}

// isLowerHex reports whether s is made of the digits writeHex writes, so
// that one minted id has one spelling.
func isLowerHex(s string) bool {
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// idCheck is the check of a minted id: a hash of the backend's id and tag.
func idCheck(id string, tag uint64) uint32 {
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(id)
	var t [8]byte
	for i := range t {
		t[i] = byte(tag >> (8 * i))
	}
	_, _ = d.Write(t[:])
	return uint32(d.Sum64())
}

// backendTag is b's tag in the ids minted for it: 48 bits of a hash of its
// URL's scheme, host and path.
func backendTag(b *fleet.Backend) uint64 {
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(b.URL.Scheme)
	_, _ = d.WriteString("://")
	_, _ = d.WriteString(b.URL.Host)
	_, _ = d.WriteString(b.URL.Path)
	return d.Sum64() >> (64 - 4*tagDigits)
}

// tagged returns the candidate whose tag is tag, or nil.
func tagged(tag uint64, cands []*fleet.Backend) *fleet.Backend {
	for _, b := range cands {
		if b.URL != nil && backendTag(b) == tag {
			return b
		}
	}
	return nil
}

// plainID reports whether id may be minted: not empty, and written the same
// in JSON, in a URL path and in Go.
func plainID(id string) bool {
	if id == "" {
		return false
	}
	for i := range len(id) {
		c := id[i]
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
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

// ResponseBackend returns the candidate that produced the Responses API
// response id (as the client holds it, minted or not), as the router
// learned it or as the id names it, or nil if none of cands did: the one
// backend that can answer a request about a stored response (GET
// /v1/responses/{id}, its cancel and input items). Counted in no metric.
// Safe for concurrent use.
func (r *Router) ResponseBackend(id string, cands []*fleet.Backend) *fleet.Backend {
	if r.pins == nil || id == "" {
		return nil
	}
	orig, tag, minted := parseResponseID(id)
	if b, ok := r.pins.lookup(orig); ok && slices.Contains(cands, b) {
		return b
	}
	if minted {
		return tagged(tag, cands)
	}
	return nil
}

// entries is the number of ids held.
func (p *pins) entries() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byID)
}

// PinStats counts what the router's response pinning did: requests with
// a previous_response_id sent to the backend that produced it, as the
// router remembered it (Pinned) or as the id named it (Decoded), whose
// backend was not a candidate (Gone), whose id was neither known nor
// minted (Unknown); ids learned from responses (Learned) and held
// (Entries).
type PinStats struct {
	Pinned, Decoded, Gone, Unknown, Learned uint64
	Entries                                 int
}

// PinStats returns the counts of the router's response pinning (all zero
// when it keeps no pins). Safe for concurrent use.
func (r *Router) PinStats() PinStats { return r.pins.stats() }

func (p *pins) stats() PinStats {
	if p == nil {
		return PinStats{}
	}
	return PinStats{Pinned: p.pinned.Load(), Decoded: p.decoded.Load(), Gone: p.gone.Load(), Unknown: p.unknown.Load(),
		Learned: p.learned.Load(), Entries: p.entries()}
}

var (
	pinRequestsDesc = prometheus.NewDesc("kvroute_response_pins_total",
		`Responses API requests with a previous_response_id, by what the router did: "pinned" (sent to the backend that produced that response, as this router remembered it), "decoded" (sent to the backend the id names: a response another replica, or this one before a restart, forwarded), "gone" (that backend is not a candidate now: removed, unhealthy, ejected; routed as any request) or "unknown" (an id neither remembered nor minted by kvroute; routed as any request).`,
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
	}{{"pinned", st.Pinned}, {"decoded", st.Decoded}, {"gone", st.Gone}, {"unknown", st.Unknown}} {
		ch <- prometheus.MustNewConstMetric(pinRequestsDesc, prometheus.CounterValue, float64(r.n), r.label)
	}
	ch <- prometheus.MustNewConstMetric(pinEntriesDesc, prometheus.GaugeValue, float64(st.Entries))
	ch <- prometheus.MustNewConstMetric(pinLearnedDesc, prometheus.CounterValue, float64(st.Learned))
}
