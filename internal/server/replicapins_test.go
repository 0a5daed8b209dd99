//go:build unix

package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/testfleet"
)

// TestResponsesAcrossReplicas runs 50 Responses API conversations of four
// turns through two kvroute replicas that share nothing, in front of three
// `kvroute emulate` processes (each stores only the responses it produced
// and answers 404 for any other previous_response_id). Each turn of a
// conversation goes to the other replica than the turn before, half of
// them streamed, and replica A is restarted (its memory of responses
// lost) in the middle of the third round. Every continuation must be
// answered by the backend that holds its previous response: the replica
// that did not see it go by finds the backend from the id the client
// holds. It logs the table of docs/BENCHMARKS.md ("Responses API
// continuations across replicas").
func TestResponsesAcrossReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("starts emulator processes")
	}
	emus := testfleet.Start(t, 3, "--time-scale", "0.1")
	reps := [2]*Server{startRouter(t, emus), startRouter(t, emus)}
	const convs, turns = 50, 4

	type phase struct {
		name                                  string
		sent, holder, notFound, other, minted int
		pins                                  router.PinStats
	}
	phases := []*phase{{name: "before the restart"}, {name: "after the restart"}}
	addPins := func(ph *phase, s *Server) {
		st := s.Router.PinStats()
		ph.pins.Pinned += st.Pinned
		ph.pins.Decoded += st.Decoded
		ph.pins.Gone += st.Gone
		ph.pins.Unknown += st.Unknown
	}
	ph := phases[0]

	prev := make([]string, convs) // each conversation's last response id, as its client holds it
	home := make([]string, convs) // and the backend that produced it
	// send plays one turn of each conversation in [from, to) at once, each
	// on its own goroutine (a conversation's turns stay in order).
	send := func(turn, from, to int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for conv := from; conv < to; conv++ {
			s := reps[(conv+turn)%2]
			wg.Go(func() {
				stream := (conv/2+turn)%2 == 1
				status, backend, id, body := responsesTurn(t, s.URL, fmt.Sprintf("conversation %d turn %d: %s", conv, turn, strings.Repeat("and so on. ", 10)), prev[conv], stream)
				mu.Lock()
				defer mu.Unlock()
				if turn > 0 {
					ph.sent++
					switch {
					case status == http.StatusOK && backend == home[conv]:
						ph.holder++
					case status == http.StatusNotFound:
						ph.notFound++
					default:
						ph.other++
					}
					if status != http.StatusOK || backend != home[conv] {
						t.Errorf("conversation %d turn %d (streamed %v): status %d from %s, its previous response %s is on %s: %s",
							conv, turn, stream, status, backend, prev[conv], home[conv], body)
					}
				}
				if orig, minted := router.OriginalResponseID(id); minted && strings.HasPrefix(orig, "resp_") {
					ph.minted++
				}
				if status != http.StatusOK || id == "" {
					t.Errorf("conversation %d turn %d: status %d, id %q: %s", conv, turn, status, id, body)
				}
				prev[conv], home[conv] = id, backend
			})
		}
		wg.Wait()
	}
	for turn := range turns {
		if turn != 2 {
			send(turn, 0, convs)
			continue
		}
		send(turn, 0, convs/2)
		// Replica A restarts: a new process, with none of the old one's
		// memory.
		for _, s := range reps {
			addPins(ph, s)
		}
		reps[0].Close()
		reps[0] = startRouter(t, emus)
		ph = phases[1]
		st := reps[1].Router.PinStats() // counted before the restart already
		ph.pins.Pinned -= st.Pinned
		ph.pins.Decoded -= st.Decoded
		ph.pins.Gone -= st.Gone
		ph.pins.Unknown -= st.Unknown
		send(turn, convs/2, convs)
		if t.Failed() {
			t.FailNow()
		}
	}
	for _, s := range reps {
		addPins(ph, s)
	}

	t.Logf("two replicas, %d conversations of %d turns, continuations alternating between the replicas, replica A restarted in round 3", convs, turns)
	t.Logf("| phase | continuations | answered by the backend holding the response | 404 | other | routed by the replica's memory | routed by the id | ids minted |")
	t.Logf("| --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, ph := range phases {
		t.Logf("| %s | %d | %d | %d | %d | %d | %d | %d |", ph.name, ph.sent, ph.holder, ph.notFound, ph.other, ph.pins.Pinned, ph.pins.Decoded, ph.minted)
	}
	for _, ph := range phases {
		if ph.pins.Pinned+ph.pins.Decoded != uint64(ph.sent) || ph.pins.Gone != 0 || ph.pins.Unknown != 0 {
			t.Errorf("%s: pins %+v, want all %d continuations pinned or decoded", ph.name, ph.pins, ph.sent)
		}
	}
	// Alternating replicas, every continuation reaches the replica that did
	// not forward its previous response: the id alone routes it.
	if phases[0].pins.Decoded == 0 || phases[1].pins.Decoded == 0 {
		t.Errorf("no continuation routed by its id: %+v, %+v", phases[0].pins, phases[1].pins)
	}
}

// responsesTurn sends one Responses API request (continuing prev, if set) to the
// router at url, and returns the status (0: no answer), the backend that
// answered, the response's id as the client sees it, and the body (or the
// error). The previous_response_id the response echoes, if any, must be
// the client's. Safe to call from several goroutines.
func responsesTurn(t *testing.T, url, input, prev string, stream bool) (status int, backend, id, body string) {
	t.Helper()
	req := map[string]any{"model": model, "input": input, "max_output_tokens": 6, "stream": stream}
	if prev != "" {
		req["previous_response_id"] = prev
	}
	data, _ := json.Marshal(req)
	res, err := http.Post(url+"/v1/responses", "application/json", strings.NewReader(string(data)))
	if err != nil {
		return 0, "", "", err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	body = string(b)
	var r struct {
		ID                 string `json:"id"`
		PreviousResponseID string `json:"previous_response_id"`
		Response           struct {
			ID                 string `json:"id"`
			PreviousResponseID string `json:"previous_response_id"`
		} `json:"response"`
	}
	if !stream {
		_ = json.Unmarshal(b, &r)
		id = r.ID
		if r.PreviousResponseID != "" && r.PreviousResponseID != prev {
			t.Errorf("previous_response_id %q in the response, the client sent %q", r.PreviousResponseID, prev)
		}
	}
	for line := range strings.SplitSeq(body, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || !stream || json.Unmarshal([]byte(data), &r) != nil || r.Response.ID == "" {
			continue
		}
		if r.Response.PreviousResponseID != "" && r.Response.PreviousResponseID != prev {
			t.Errorf("previous_response_id %q in the stream, the client sent %q", r.Response.PreviousResponseID, prev)
		}
		if id == "" {
			id = r.Response.ID
		} else if r.Response.ID != id {
			t.Errorf("the stream's events name the response %q and %q", id, r.Response.ID)
		}
	}
	return res.StatusCode, res.Header.Get(proxy.HeaderBackend), id, body
}
