package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// responsesEvents is a Responses API stream.
var responsesEvents = []string{
	"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"usage\":null}}\n\n",
	"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n",
	"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"usage\":{\"input_tokens\":9,\"input_tokens_details\":{\"cached_tokens\":4},\"output_tokens\":1,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":10}}}\n\n",
}

// responsesBody is a non-streamed Responses API answer.
const responsesBody = `{"id":"resp_2","object":"response","status":"completed","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hi"}]}],` +
	`"usage":{"input_tokens":20,"input_tokens_details":{"cached_tokens":16},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":22}}`

func TestResponsesEndpoint(t *testing.T) {
	upstream := make(chan string, 2)
	be := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		upstream <- r.URL.Path + " " + string(data)
		if !strings.Contains(string(data), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, responsesBody)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range responsesEvents {
			_, _ = io.WriteString(w, ev)
			_ = http.NewResponseController(w).Flush()
		}
	}))
	b0 := testBackend(t, 0, "b0", be.URL, "m")
	pol := newFirstPolicy()
	_, px := newTestProxy(t, newFakeFleet(b0), pol, nil)

	t.Run("streamed", func(t *testing.T) {
		body := `{"model":"m","instructions":"S","input":"Hi","stream":true,"max_output_tokens":5,"previous_response_id":"resp_0"}`
		res, got := post(t, px.URL, "/v1/responses", body)
		if res.StatusCode != http.StatusOK || got != strings.Join(responsesEvents, "") {
			t.Errorf("status %d, body %q, want the events unchanged", res.StatusCode, got)
		}
		if up := <-upstream; up != "/v1/responses "+body {
			t.Errorf("backend got %q, want the body unchanged", up)
		}
		o := pol.outcome(t)
		if o.Request.SessionKey != "resp_0" || o.Request.MaxTokens != 5 || o.Request.Prompt != "system\nS\nuser\nHi\n" {
			t.Errorf("request %+v", *o.Request)
		}
		if o.Tokens != 1 || o.TTFT <= 0 || o.PromptTokens != 9 || o.CachedTokens != 4 || o.CompletionTokens != 1 {
			t.Errorf("outcome %+v, want 1 token, a TTFT, usage 9/4/1", o.Outcome)
		}
		px.await(t)
		assertIdle(t, b0)
	})
	t.Run("not streamed", func(t *testing.T) {
		body := `{"model":"m","input":[{"role":"user","content":"Hi"}]}`
		res, got := post(t, px.URL, "/v1/responses", body)
		if res.StatusCode != http.StatusOK || got != responsesBody {
			t.Errorf("status %d, body %q", res.StatusCode, got)
		}
		<-upstream
		o := pol.outcome(t)
		if o.PromptTokens != 20 || o.CachedTokens != 16 || o.CompletionTokens != 2 {
			t.Errorf("outcome %+v, want usage 20/16/2", o.Outcome)
		}
		px.await(t)
		assertIdle(t, b0)
	})
	t.Run("stored responses are not served", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, px.URL+"/v1/responses/resp_1", nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusNotFound {
			t.Errorf("GET /v1/responses/resp_1: status %d, want 404", res.StatusCode)
		}
	})
}
