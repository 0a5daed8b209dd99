//go:build unix

package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/testfleet"
)

// TestResponsesPinnedEndToEnd runs Responses API conversations through
// kvroute to four `kvroute emulate` processes, which, as vLLM, each hold
// the responses they produced and answer 404 for a previous_response_id
// they do not. Every continuation goes back to the backend of its
// previous response (X-Kvroute-Route: response), streamed or not, and so
// does a GET of the stored response (allowed with --allow-path). When
// that backend dies, the continuation is routed as any request (and the
// backend that gets it answers its own 404), counted as "gone".
func TestResponsesPinnedEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts emulator processes")
	}
	emus := testfleet.Start(t, 4)
	// Stored responses may be read through kvroute (they are not by
	// default).
	s := startRouter(t, emus, func(c *Config) { c.Proxy.Security.AllowPaths = []string{"/v1/responses"} })
	send := func(input, prev string, stream bool) (status int, backend, route, id string, body string) {
		t.Helper()
		req := map[string]any{"model": model, "input": input, "max_output_tokens": 6, "stream": stream}
		if prev != "" {
			req["previous_response_id"] = prev
		}
		data, _ := json.Marshal(req)
		res, err := http.Post(s.URL+"/v1/responses", "application/json", strings.NewReader(string(data)))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		body = string(b)
		var r struct {
			ID       string `json:"id"`
			Response struct {
				ID string `json:"id"`
			} `json:"response"`
		}
		if !stream {
			_ = json.Unmarshal(b, &r)
			id = r.ID
		}
		for line := range strings.SplitSeq(body, "\n") {
			if data, ok := strings.CutPrefix(line, "data: "); ok && stream && id == "" && json.Unmarshal([]byte(data), &r) == nil {
				id = r.Response.ID
			}
		}
		return res.StatusCode, res.Header.Get(proxy.HeaderBackend), res.Header.Get(proxy.HeaderRoute), id, body
	}

	var lastID, lastBackend string
	for conv := range 4 {
		prev, home := "", ""
		for turn := range 5 {
			stream := (conv+turn)%2 == 1
			status, backend, route, id, body := send(fmt.Sprintf("conversation %d turn %d: %s", conv, turn, strings.Repeat("more. ", 20)), prev, stream)
			if status != http.StatusOK || id == "" || !strings.HasPrefix(id, "resp_") {
				t.Fatalf("conversation %d turn %d: status %d, id %q: %s", conv, turn, status, id, body)
			}
			if turn > 0 && (backend != home || route != router.ReasonResponse) {
				t.Fatalf("conversation %d turn %d: backend %s (route %q), its previous response is on %s", conv, turn, backend, route, home)
			}
			prev, home = id, backend
		}
		lastID, lastBackend = prev, home
		// The stored response is read where it is stored.
		res, err := http.Get(s.URL + "/v1/responses/" + prev)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || res.Header.Get(proxy.HeaderBackend) != home || !strings.Contains(string(b), prev) {
			t.Fatalf("GET %s: %d from %s, want it from %s: %s", prev, res.StatusCode, res.Header.Get(proxy.HeaderBackend), home, b)
		}
	}

	// The backend holding the last conversation dies: the continuation is
	// routed elsewhere, where the response is unknown.
	for i, b := range s.Fleet.Backends() {
		if b.Name == lastBackend {
			emus[i].Kill()
			waitFor(t, func() bool { return !b.Healthy() })
		}
	}
	status, backend, route, _, body := send("still there?", lastID, false)
	if status != http.StatusNotFound || backend == lastBackend || route == router.ReasonResponse {
		t.Errorf("after its backend died: status %d from %s (route %q): %s; want another backend's 404", status, backend, route, body)
	}
	if st := s.Router.PinStats(); st.Pinned != 16 || st.Gone != 1 || st.Unknown != 0 {
		t.Errorf("pins %+v: want 16 pinned (4 continuations in each of 4 conversations), 1 gone", st)
	}
}
