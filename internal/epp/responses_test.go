package epp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
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
