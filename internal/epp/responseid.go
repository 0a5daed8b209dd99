package epp

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/router"
)

// The picker maps Responses API ids as kvroute serve does (decision 0019):
// the id a client gets names the endpoint that stores the response, so
// that any picker replica, restarted or not, sends its continuation there.
// On the way in it sees the whole request body and its path, which it
// sends on rewritten; on the way out it sees the response body only
// because the filter streams it through (response_body_mode
// FULL_DUPLEX_STREAMED), and rewrites it as it passes, holding back only
// the bytes that may be the start of an id.

// maxHeldBytes bounds what the picker holds of a response while it waits
// for the response's id (a stream's first event, a JSON body's end): past
// it the rest passes unchanged.
const maxHeldBytes = responseBodyLimit

// idMap is what one exchange maps between the ids its endpoint uses and
// those its client holds.
type idMap struct {
	// mint is set when the response's own id is to be minted (a Responses
	// API POST).
	mint bool
	// client and orig are an id the client sent minted and the endpoint's
	// own, which the endpoint got instead and may echo.
	client, orig string

	// The response's rewriting, once started (for a successful answer):
	// from and to are quoted ids, maxPrefix the longest proper prefix of
	// one; held is what has not been sent yet; waiting is set until the
	// response's id is known (when minting), which mintFor then mints;
	// off once the rest passes as it is; sse for a stream.
	started   bool
	from, to  [][]byte
	maxPrefix int
	held      []byte
	waiting   bool
	mintFor   func(string) string
	off       bool
	sse       bool
}

// responsesRequest returns what a Responses API POST maps, and the body to
// send on: the endpoint gets its own previous_response_id. nil when the
// router does not mint and the client's id was not minted.
func responsesRequest(r *router.Router, body []byte, prev string) (*idMap, []byte) {
	m := &idMap{mint: r.MintsResponseIDs()}
	if out, orig := request.WithOriginalResponseID(body, prev); orig != "" {
		body, m.client, m.orig = out, prev, orig
	}
	if !m.mint && m.client == "" {
		return nil, body
	}
	return m, body
}

// storedResponsePath returns the path of a request about a stored response
// with the endpoint's own id, and what its answer maps; "" and nil for an
// id kvroute did not mint.
func storedResponsePath(path, id string) (string, *idMap) {
	orig, minted := router.OriginalResponseID(id)
	if !minted {
		return "", nil
	}
	at := len("/v1/responses/")
	return path[:at] + orig + path[at+len(id):], &idMap{client: id, orig: orig}
}

// start readies the rewriting of a successful response from endpoint b
// (nil: not one of the fleet's, nothing minted); sse is set for a stream.
func (m *idMap) start(r *router.Router, b *fleet.Backend, sse bool) {
	m.started, m.sse = true, sse
	m.add(m.orig, m.client)
	if m.mint && b != nil {
		m.waiting = true
		m.mintFor = func(id string) string { return r.MintResponseID(id, b) }
	}
}

func (m *idMap) add(orig, client string) {
	if orig == "" || orig == client {
		return
	}
	m.from = append(m.from, strconv.AppendQuote(nil, orig))
	m.to = append(m.to, strconv.AppendQuote(nil, client))
	m.maxPrefix = max(m.maxPrefix, len(m.from[len(m.from)-1])-1)
}

// feed takes the next chunk of the response body (w has read it already)
// and returns what may go to the client now; at eos, all that is left.
func (m *idMap) feed(w *watcher, b []byte, eos bool) []byte {
	if m.off {
		return b
	}
	m.held = append(m.held, b...)
	if m.waiting {
		id := ""
		switch {
		case m.sse:
			id = w.responseID
		case eos:
			var doc struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(m.held, &doc) == nil {
				id = doc.ID
			}
		}
		switch {
		case id != "":
			m.waiting = false
			m.add(id, m.mintFor(id))
		case eos || len(m.held) > maxHeldBytes:
			m.waiting, m.off = false, true // no id to be had: as it is
			out := m.held
			m.held = nil
			return out
		default:
			return nil
		}
	}
	// Whole ids first; then an end that may be the start of one waits.
	out := m.rewrite(m.held)
	keep := 0
	if !eos {
		keep = m.partialTail(out)
	}
	m.held = append(m.held[:0], out[len(out)-keep:]...)
	return out[:len(out)-keep]
}

// partialTail is the length of the longest end of h that may be the start
// of an id to rewrite, which must wait for the next chunk.
func (m *idMap) partialTail(h []byte) int {
	for i := max(0, len(h)-m.maxPrefix); i < len(h); i++ {
		if h[i] != '"' {
			continue
		}
		for _, from := range m.from {
			if bytes.HasPrefix(from, h[i:]) {
				return len(h) - i
			}
		}
	}
	return 0
}

// rewrite returns b with every id replaced, in a new slice.
func (m *idMap) rewrite(b []byte) []byte {
	out := append([]byte(nil), b...)
	for i, from := range m.from {
		if bytes.Contains(out, from) {
			out = bytes.ReplaceAll(out, from, m.to[i])
		}
	}
	return out
}
