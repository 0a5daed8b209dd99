package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/auth"
)

// messagesEvents is a Messages API stream as Anthropic sends it.
var messagesEvents = []string{
	"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":3,\"cache_read_input_tokens\":16,\"cache_creation_input_tokens\":0,\"output_tokens\":1}}}\n\n",
	"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
	"event: ping\ndata: {\"type\":\"ping\"}\n\n",
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
	"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
	"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":1}}\n\n",
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
}

// messagesBody is a non-streamed Messages API answer.
const messagesBody = `{"id":"msg_2","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"model":"m","stop_reason":"end_turn","stop_sequence":null,` +
	`"usage":{"input_tokens":4,"cache_read_input_tokens":32,"cache_creation_input_tokens":0,"output_tokens":2}}`

// anthropicError reads an Anthropic-shaped error body; it fails the test
// on any other shape.
func anthropicError(t *testing.T, body string) (typ, message string) {
	t.Helper()
	var e struct {
		Type  string `json:"type"`
		Error *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Type != "error" || e.Error == nil || e.Error.Message == "" {
		t.Fatalf("body %q is not an Anthropic error (%v)", body, err)
	}
	return e.Error.Type, e.Error.Message
}

func TestMessagesEndpoint(t *testing.T) {
	upstream := make(chan *http.Request, 4)
	be := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		upstream <- r
		if !strings.Contains(string(data), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, messagesBody)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range messagesEvents {
			_, _ = io.WriteString(w, ev)
			_ = http.NewResponseController(w).Flush()
		}
	}))
	b0 := testBackend(t, 0, "b0", be.URL, "m")
	pol := newFirstPolicy()
	_, px := newTestProxy(t, newFakeFleet(b0), pol, func(c *Config) {
		c.Security.APIKeys = []auth.APIKey{{Key: "k", Name: "n"}}
	})

	t.Run("streamed", func(t *testing.T) {
		body := `{"model":"m","system":"S","messages":[{"role":"user","content":"Hi"}],"max_tokens":5,"stream":true,"metadata":{"user_id":"u1"}}`
		res, got := post(t, px.URL, "/v1/messages", body, "X-Api-Key", "k")
		if res.StatusCode != http.StatusOK || got != strings.Join(messagesEvents, "") {
			t.Errorf("status %d, body %q, want the events unchanged", res.StatusCode, got)
		}
		up := <-upstream
		if up.Header.Get("X-Api-Key") != "" {
			t.Error("the client's x-api-key reached the backend")
		}
		o := pol.outcome(t)
		if o.Request.SessionKey != "u1" || o.Request.MaxTokens != 5 || o.Request.Prompt != "system\nS\nuser\nHi\n" {
			t.Errorf("request %+v", *o.Request)
		}
		if o.Tokens != 1 || o.TTFT <= 0 || o.PromptTokens != 19 || o.CachedTokens != 16 || o.CompletionTokens != 1 {
			t.Errorf("outcome %+v, want 1 token, a TTFT, usage 19/16/1", o.Outcome)
		}
		px.await(t)
		assertIdle(t, b0)
	})
	t.Run("not streamed", func(t *testing.T) {
		body := `{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":5}`
		res, got := post(t, px.URL, "/v1/messages", body, "Authorization", "Bearer k")
		if res.StatusCode != http.StatusOK || got != messagesBody {
			t.Errorf("status %d, body %q", res.StatusCode, got)
		}
		<-upstream
		o := pol.outcome(t)
		if o.PromptTokens != 36 || o.CachedTokens != 32 || o.CompletionTokens != 2 {
			t.Errorf("outcome %+v, want usage 36/32/2", o.Outcome)
		}
		px.await(t)
		assertIdle(t, b0)
	})
	for _, tt := range []struct {
		name, method, path, body, key string
		status                        int
		typ                           string
	}{
		{"no key", "POST", "/v1/messages", `{}`, "", 401, "authentication_error"},
		{"wrong key", "POST", "/v1/messages", `{}`, "x", 401, "authentication_error"},
		{"bad JSON", "POST", "/v1/messages", `{"model":`, "k", 400, "invalid_request_error"},
		{"no max_tokens", "POST", "/v1/messages", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "k", 400, "invalid_request_error"},
		{"unknown model", "POST", "/v1/messages", `{"model":"other","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, "k", 404, "not_found_error"},
		{"GET", "GET", "/v1/messages", ``, "k", 405, "invalid_request_error"},
		{"too large", "POST", "/v1/messages", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("x", 2<<10) + `"}]}`, "k", 413, "request_too_large"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, px := newTestProxy(t, newFakeFleet(b0), pol, func(c *Config) {
				c.Security.APIKeys = []auth.APIKey{{Key: "k", Name: "n"}}
				c.MaxBodyBytes = 1 << 10
			})
			req, _ := http.NewRequest(tt.method, px.URL+tt.path, strings.NewReader(tt.body))
			if tt.key != "" {
				req.Header.Set("X-Api-Key", tt.key)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if typ, _ := anthropicError(t, string(data)); res.StatusCode != tt.status || typ != tt.typ {
				t.Errorf("%d %s, want %d %s", res.StatusCode, typ, tt.status, tt.typ)
			}
		})
	}
}

// TestMessagesCutStream: a Messages stream whose backend fails after its
// first event ends with Anthropic's error event, not OpenAI's with [DONE],
// and is not migrated (there is another backend it could have gone to).
func TestMessagesCutStream(t *testing.T) {
	cut := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range messagesEvents[:4] {
			_, _ = io.WriteString(w, ev)
		}
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	}))
	other := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the cut stream went to another backend")
	}))
	b0, b1 := testBackend(t, 0, "b0", cut.URL, "m"), testBackend(t, 1, "b1", other.URL, "m")
	_, px := newTestProxy(t, newFakeFleet(b0, b1), newFirstPolicy(), nil)
	res, got := post(t, px.URL, "/v1/messages", `{"model":"m","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"Hi"}]}`)
	want := strings.Join(messagesEvents[:4], "") + "event: error\ndata: "
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(got, want) || strings.Contains(got, "[DONE]") {
		t.Fatalf("status %d, stream %q: want the events sent, then an error event", res.StatusCode, got)
	}
	typ, msg := anthropicError(t, strings.TrimSpace(strings.TrimPrefix(got, want)))
	if typ != "api_error" || !strings.Contains(msg, "b0") {
		t.Errorf("error event %s %q, want api_error naming b0", typ, msg)
	}
	px.await(t)
	assertIdle(t, b0, b1)
}

// TestMessagesRefusalsInAnthropicShape: admission's 429 (every backend at
// its cap, no queue) and the 503 of no backend in rotation are in
// Anthropic's shape on /v1/messages.
func TestMessagesRefusalsInAnthropicShape(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	be := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, messagesBody)
	}))
	b0 := testBackend(t, 0, "b0", be.URL, "m")
	_, px := newTestProxy(t, newFakeFleet(b0), newFirstPolicy(), func(c *Config) {
		c.Overload = Overload{MaxPerBackend: 1, Admission: admission.Config{MaxQueue: -1}}
	})
	body := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"Hi"}]}`
	first := make(chan int)
	go func() {
		res, err := http.Post(px.URL+"/v1/messages", "application/json", strings.NewReader(body))
		if err != nil {
			first <- 0
			return
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		first <- res.StatusCode
	}()
	<-arrived
	res, got := post(t, px.URL, "/v1/messages", body)
	if typ, _ := anthropicError(t, got); res.StatusCode != http.StatusTooManyRequests || typ != "rate_limit_error" {
		t.Errorf("at the cap: %d %s, want 429 rate_limit_error", res.StatusCode, typ)
	}
	close(release)
	if status := <-first; status != http.StatusOK {
		t.Errorf("the request in flight: %d", status)
	}
	px.await(t)
	b0.SetHealthy(false)
	res, got = post(t, px.URL, "/v1/messages", body)
	if typ, _ := anthropicError(t, got); res.StatusCode != http.StatusServiceUnavailable || typ != "overloaded_error" {
		t.Errorf("no backend: %d %s, want 503 overloaded_error", res.StatusCode, typ)
	}
}
