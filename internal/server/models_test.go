//go:build unix

package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/testfleet"
)

// TestThreeModelsEndToEnd runs kvroute in front of seven `kvroute emulate`
// processes serving three models (the default on three, model-b and
// model-c on two each). Every request lands on a server of its model; a
// model nobody serves is a 404 model_not_found; once model-b's two servers
// are killed, a request for it is a 503 naming the model, with a
// Retry-After, while the other models are served as before.
func TestThreeModelsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts emulator processes")
	}
	emus := testfleet.Start(t, 3)
	emus = append(emus, testfleet.Start(t, 2, "--model", "model-b")...)
	emus = append(emus, testfleet.Start(t, 2, "--model", "model-c")...)
	s := startRouter(t, emus)
	servers := map[string][]string{model: {"gpu0", "gpu1", "gpu2"}, "model-b": {"gpu3", "gpu4"}, "model-c": {"gpu5", "gpu6"}}

	type apiError struct {
		Error struct {
			Message, Type, Code string
			Param               *string
		}
	}
	send := func(m, prompt string) (status int, backend string, retryAfter string, e apiError) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": m, "max_tokens": 4,
			"messages": []map[string]string{{"role": "user", "content": prompt}}})
		res, err := http.Post(s.URL+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		data, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK {
			if err := json.Unmarshal(data, &e); err != nil || e.Error.Message == "" {
				t.Fatalf("model %s: status %d with a body that is no OpenAI error: %s", m, res.StatusCode, data)
			}
		}
		return res.StatusCode, res.Header.Get(proxy.HeaderBackend), res.Header.Get("Retry-After"), e
	}

	used := map[string]bool{}
	for i := range 8 {
		for _, m := range []string{model, "model-b", "model-c"} {
			status, backend, _, e := send(m, fmt.Sprintf("conversation %d about %s: %s", i, m, strings.Repeat("words ", 30)))
			if status != http.StatusOK || !slices.Contains(servers[m], backend) {
				t.Fatalf("model %s: status %d from %q (%s); want 200 from one of %v", m, status, backend, e.Error.Message, servers[m])
			}
			used[backend] = true
		}
	}
	if len(used) < 5 {
		t.Errorf("8 requests per model used only %d of the 7 servers: %v", len(used), used)
	}

	status, _, _, e := send("no-such-model", "hello")
	if status != http.StatusNotFound || e.Error.Code != "model_not_found" || e.Error.Type != "invalid_request_error" ||
		e.Error.Param == nil || *e.Error.Param != "model" || !strings.Contains(e.Error.Message, "no-such-model") {
		t.Errorf("unknown model: %d %+v; want 404 invalid_request_error model_not_found on param model", status, e.Error)
	}

	for i := 3; i < 5; i++ {
		emus[i].Kill()
	}
	waitFor(t, func() bool {
		for _, b := range s.Fleet.Backends() {
			if (b.Name == "gpu3" || b.Name == "gpu4") && b.Healthy() {
				return false
			}
		}
		return true
	})
	status, _, retry, e := send("model-b", "is anyone there?")
	if status != http.StatusServiceUnavailable || e.Error.Code != "service_unavailable" || e.Error.Type != "server_error" ||
		!strings.Contains(e.Error.Message, "model-b") || retry == "" {
		t.Errorf("model-b with its servers down: %d (Retry-After %q) %+v; want 503 service_unavailable naming model-b, with a Retry-After", status, retry, e.Error)
	}
	for _, m := range []string{model, "model-c"} {
		if status, backend, _, e := send(m, "still here?"); status != http.StatusOK || !slices.Contains(servers[m], backend) {
			t.Errorf("model %s after model-b's servers died: %d from %q (%s)", m, status, backend, e.Error.Message)
		}
	}
}
