package epp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/router"
)

// TestResponsesStayWithTheirEndpoint runs Responses API conversations
// through the picker to emulators that, as vLLM, hold each response they
// produced and answer 404 for a previous_response_id they do not: every
// turn after the first must go to the endpoint of the turn before, which
// the picker learns from the response's id (response.created in a stream,
// the body's id otherwise), whatever the policy would pick.
func TestResponsesStayWithTheirEndpoint(t *testing.T) {
	ctx := t.Context()
	bs := emulators(t, ctx, 4)
	for _, policy := range []string{"kvroute", "round-robin"} {
		t.Run(policy, func(t *testing.T) {
			s, env := startPicker(t, ctx, bs, policy, Options{Fallbacks: 1})
			env.rewrites = true // the ids (responseid.go)
			for conv := range 4 {
				prev, home := "", ""
				for turn := range 4 {
					stream := (conv+turn)%2 == 0
					req := map[string]any{"model": model(bs), "input": fmt.Sprintf("conversation %d, turn %d: go on.", conv, turn),
						"max_output_tokens": 6, "stream": stream}
					if prev != "" {
						req["previous_response_id"] = prev
					}
					body, _ := json.Marshal(req)
					res, err := env.do(ctx, "/v1/responses", nil, body)
					if err != nil {
						t.Fatal(err)
					}
					if res.status != http.StatusOK {
						t.Fatalf("conversation %d turn %d (after %s on %s): status %d: %s", conv, turn, prev, home, res.status, res.body)
					}
					if home != "" && res.list[0] != home {
						t.Fatalf("conversation %d turn %d went to %s, its previous response is on %s", conv, turn, res.list[0], home)
					}
					home, prev = res.list[0], responseID(t, res.body, stream)
				}
				// The stored response is read where it is stored.
				env.method = http.MethodGet
				res, err := env.do(ctx, "/v1/responses/"+prev, nil, nil)
				env.method = ""
				if err != nil {
					t.Fatal(err)
				}
				if res.status != http.StatusOK || res.list[0] != home || responseID(t, res.body, false) != prev {
					t.Fatalf("GET %s: status %d from %v, want it from %s: %s", prev, res.status, res.list, home, res.body)
				}
			}
			if st := s.Router.PinStats(); st.Pinned != 12 || st.Gone+st.Unknown != 0 || st.Learned != 16 {
				t.Errorf("pins %+v: want 12 pinned (3 continuations in each of 4 conversations), 16 learned", st)
			}
		})
	}
}

// responseID reads the id of a Responses API response, streamed or not.
func responseID(t *testing.T, body []byte, stream bool) string {
	t.Helper()
	var r struct {
		ID       string `json:"id"`
		Response struct {
			ID string `json:"id"`
		} `json:"response"`
	}
	if !stream {
		if err := json.Unmarshal(body, &r); err != nil || r.ID == "" {
			t.Fatalf("no id in %s", body)
		}
		return r.ID
	}
	for _, line := range strings.Split(string(body), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && json.Unmarshal([]byte(data), &r) == nil && r.Response.ID != "" {
			return r.Response.ID
		}
	}
	t.Fatalf("no response.created in %s", body)
	return ""
}

// TestResponsesAcrossPickers runs Responses API conversations through two
// pickers that share nothing (two replicas), each turn through the other
// one than the turn before, half of them streamed, and restarts the first
// picker midway: every continuation reaches the endpoint that stores its
// previous response, found from the id the client holds (the picker that
// gets it did not see the response go by), and the endpoint gets its own
// id back; so does a request for the stored response.
func TestResponsesAcrossPickers(t *testing.T) {
	ctx := t.Context()
	bs := emulators(t, ctx, 3)
	start := func() (*Server, *envoy) {
		s, env := startPicker(t, ctx, bs, "round-robin", Options{Fallbacks: 1})
		env.rewrites = true
		return s, env
	}
	sA, envA := start()
	sB, envB := start()
	pickers := []*envoy{envA, envB}
	var decoded uint64
	const convs, turns = 6, 4
	prev, home := make([]string, convs), make([]string, convs)
	for turn := range turns {
		if turn == 2 {
			decoded += sA.Router.PinStats().Decoded
			sA.Close()
			sA, pickers[0] = start()
		}
		for conv := range convs {
			env := pickers[(conv+turn)%2]
			stream := (conv/2+turn)%2 == 1
			req := map[string]any{"model": model(bs), "input": fmt.Sprintf("conversation %d, turn %d: go on.", conv, turn),
				"max_output_tokens": 6, "stream": stream}
			if prev[conv] != "" {
				req["previous_response_id"] = prev[conv]
			}
			body, _ := json.Marshal(req)
			res, err := env.do(ctx, "/v1/responses", nil, body)
			if err != nil {
				t.Fatal(err)
			}
			if res.status != http.StatusOK || home[conv] != "" && res.list[0] != home[conv] {
				t.Fatalf("conversation %d turn %d (streamed %v): status %d from %s, its previous response %s is on %s: %s",
					conv, turn, stream, res.status, res.list[0], prev[conv], home[conv], res.body)
			}
			id, orig := responseID(t, res.body, stream), responseID(t, res.upstream, stream)
			if back, minted := router.OriginalResponseID(id); !minted || back != orig || !res.dropLength {
				t.Fatalf("conversation %d turn %d: the client got the id %q for the endpoint's %q (dropped length %v)", conv, turn, id, orig, res.dropLength)
			}
			if want := strings.ReplaceAll(string(res.upstream), `"`+orig+`"`, `"`+id+`"`); string(res.body) != want {
				t.Fatalf("conversation %d turn %d: the body came back\n%s\nwant the endpoint's with its id mapped\n%s", conv, turn, res.body, want)
			}
			prev[conv], home[conv] = id, res.list[0]
		}
	}
	decoded += sA.Router.PinStats().Decoded + sB.Router.PinStats().Decoded
	if decoded != convs*(turns-1) {
		t.Errorf("%d continuations routed by their id, want all %d", decoded, convs*(turns-1))
	}
	// The stored response, through the picker that did not produce it: the
	// endpoint is asked for its own id, the client sees its own.
	envB.method = http.MethodGet
	res, err := envB.do(ctx, "/v1/responses/"+prev[0], nil, nil)
	envB.method = ""
	if err != nil {
		t.Fatal(err)
	}
	orig, _ := router.OriginalResponseID(prev[0])
	if res.status != http.StatusOK || res.list[0] != home[0] || res.path != "/v1/responses/"+orig || responseID(t, res.body, false) != prev[0] {
		t.Errorf("GET %s: status %d from %v at %s, want it from %s at /v1/responses/%s: %s", prev[0], res.status, res.list, res.path, home[0], orig, res.body)
	}
}
