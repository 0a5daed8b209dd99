package emulator

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// respJSON is a client's view of a Responses API response.
type respJSON struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Status string `json:"status"`
	Output []struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage struct {
		InputTokens        int `json:"input_tokens"`
		OutputTokens       int `json:"output_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
	} `json:"usage"`
}

// TestResponsesContinueStoredConversations checks the Responses API: each
// response has its own id; a request naming one continues its
// conversation (a longer prompt, cached where it repeats); an id the server
// does not hold is a 404; a stream starts with response.created carrying
// the id and ends with response.completed carrying the usage.
func TestResponsesContinueStoredConversations(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	url += "/v1/responses"
	first := map[string]any{"model": testModel, "instructions": "be brief", "input": strings.Repeat("tell me about caches. ", 30), "max_output_tokens": 8}
	resp, body := post(t, url, first)
	var r1 respJSON
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &r1) != nil || !strings.HasPrefix(r1.ID, "resp_") ||
		r1.Object != "response" || r1.Status != "completed" || len(r1.Output) != 1 || r1.Output[0].Content[0].Text == "" {
		t.Fatalf("first response %d: %s", resp.StatusCode, body)
	}
	_, body = post(t, url, first)
	var again respJSON
	if json.Unmarshal(body, &again) != nil || again.ID == r1.ID {
		t.Fatalf("two responses share the id %q", r1.ID)
	}

	next := map[string]any{"model": testModel, "previous_response_id": r1.ID, "input": "and then?", "max_output_tokens": 8}
	resp, body = post(t, url, next)
	var r2 respJSON
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &r2) != nil {
		t.Fatalf("continuation %d: %s", resp.StatusCode, body)
	}
	if r2.Usage.InputTokens <= r1.Usage.InputTokens+r1.Usage.OutputTokens || r2.Usage.InputTokensDetails.CachedTokens < r1.Usage.InputTokens/2 {
		t.Errorf("continuation: %d input tokens (%d cached) after %d+%d: want the first conversation as its cached prefix",
			r2.Usage.InputTokens, r2.Usage.InputTokensDetails.CachedTokens, r1.Usage.InputTokens, r1.Usage.OutputTokens)
	}

	got, err := http.Get(url + "/" + r2.ID)
	if err != nil {
		t.Fatal(err)
	}
	var stored respJSON
	if err := json.NewDecoder(got.Body).Decode(&stored); err != nil || got.StatusCode != http.StatusOK || stored.ID != r2.ID ||
		stored.Output[0].Content[0].Text != r2.Output[0].Content[0].Text {
		t.Errorf("GET the stored response: %d %+v %v", got.StatusCode, stored, err)
	}
	got.Body.Close()
	if got, err := http.Get(url + "/resp_elsewhere"); err != nil || got.StatusCode != http.StatusNotFound {
		t.Errorf("GET an unknown response: %v %v, want 404", got.StatusCode, err)
	}

	resp, body = post(t, url, map[string]any{"model": testModel, "previous_response_id": "resp_elsewhere", "input": "hi"})
	if resp.StatusCode != http.StatusNotFound || !bytes.Contains(body, []byte("resp_elsewhere")) {
		t.Errorf("unknown previous_response_id: %d %s, want 404", resp.StatusCode, body)
	}

	next["stream"], next["previous_response_id"] = true, r2.ID
	resp, body = post(t, url, next)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream %d: %s", resp.StatusCode, body)
	}
	var types []string
	var created, completed respJSON
	for _, ev := range strings.Split(strings.TrimSpace(string(body)), "\n\n") {
		_, data, _ := strings.Cut(ev, "data: ")
		var e struct {
			Type     string   `json:"type"`
			Response respJSON `json:"response"`
		}
		if err := json.Unmarshal([]byte(data), &e); err != nil {
			t.Fatalf("event %q: %v", ev, err)
		}
		types = append(types, e.Type)
		switch e.Type {
		case "response.created":
			created = e.Response
		case "response.completed":
			completed = e.Response
		}
	}
	if len(types) != 10 || types[0] != "response.created" || types[1] != "response.output_text.delta" || types[9] != "response.completed" {
		t.Errorf("events %v: want created, 8 deltas, completed", types)
	}
	if !strings.HasPrefix(created.ID, "resp_") || created.ID != completed.ID || completed.Usage.OutputTokens != 8 {
		t.Errorf("created %+v, completed %+v", created, completed)
	}
}
