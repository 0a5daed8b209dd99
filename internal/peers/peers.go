// Package peers shares router replicas' in-flight counts. Every replica
// counts exactly the work it sent each backend (fleet.Load) but not what
// the other replicas sent, so a burst split across replicas herds onto the
// backend each of them believes idle. Each replica serves its counts (Handler)
// and follows the others' (Poller); the sum reaches the policy through
// fleet.Backend.SetPeerLoad. Each replica pushes its changes as they
// happen (Hub, at StreamPath) and its peers follow that stream, so a pick
// reaches the others within a round trip; a peer that does not serve the
// stream (an older replica) is polled instead, every 100 ms. Plain HTTP
// keeps it to the standard library and to what an operator can read with
// curl.
package peers

import (
	"encoding/json"
	"net/http"

	"github.com/kvroute/kvroute/internal/fleet"
)

// Path is where a replica serves its counts, on its metrics listener (or
// its API listener when it has none).
const Path = "/kvroute/peers/load"

// Report is one replica's counts: the work it has in flight on each
// backend, by backend URL (the name every replica shares; indexes and
// names are each replica's own).
type Report struct {
	// Replica names the reporter, so that a replica finding itself among
	// its peers (a headless Service lists every pod) ignores its own report.
	Replica  string            `json:"replica"`
	Backends map[string]Counts `json:"backends"`
}

// Counts is fleet.Load on the wire.
type Counts struct {
	Requests      int64 `json:"requests"`
	PrefillTokens int64 `json:"prefill_tokens"`
	Decoding      int64 `json:"decoding"`
	DecodeTokens  int64 `json:"decode_tokens"`
}

func (c Counts) load() fleet.Load {
	return fleet.Load{Requests: c.Requests, PrefillTokens: c.PrefillTokens, Decoding: c.Decoding, DecodeTokens: c.DecodeTokens}
}

// Snapshot returns the report of replica id over backends: only those with
// work in flight, so an idle fleet of a thousand costs a few bytes.
func Snapshot(id string, backends []*fleet.Backend) Report {
	r := Report{Replica: id, Backends: make(map[string]Counts)}
	for _, b := range backends {
		l := b.Load()
		if l == (fleet.Load{}) || b.URL == nil {
			continue
		}
		r.Backends[b.URL.String()] = countsOf(l)
	}
	return r
}

// Handler serves replica id's report on the fleet's current backends.
func Handler(id string, backends func() []*fleet.Backend) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(Snapshot(id, backends()))
	})
}
