package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/auth"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/router"
)

const chatBody = `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there"}],"max_tokens":8}`

// seen is what a fake backend received.
type seen struct {
	method, path, query string
	header              http.Header
	body                string
}

// recordingBackend answers every request with status, header and body, and
// records what it received.
func recordingBackend(t *testing.T, status int, header http.Header, body string) (*server, chan seen) {
	got := make(chan seen, 10)
	s := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), string(data)}
		for k, vv := range header {
			w.Header()[k] = vv
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	return s, got
}

func TestNonStreamingPassThrough(t *testing.T) {
	const reply = `{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi!"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":21,"completion_tokens":3,"total_tokens":24,"prompt_tokens_details":{"cached_tokens":16}}}`
	be, got := recordingBackend(t, http.StatusOK, http.Header{
		"Content-Type": {"application/json"},
		"X-Engine":     {"vllm"},
		"Connection":   {"X-Hop"},
		"X-Hop":        {"1"},
	}, reply)
	b0 := testBackend(t, 0, "b0", be.URL+"/prefix/", "m")
	pol := newFirstPolicy()
	pol.prefix = 4
	_, px := newTestProxy(t, newFakeFleet(b0), pol, nil)

	req, _ := http.NewRequest(http.MethodPost, px.URL+"/v1/chat/completions?trace=1", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer k")
	req.Header.Set("Accept-Encoding", "gzip")
	req.Header.Set("Connection", "X-Client-Hop")
	req.Header.Set("X-Client-Hop", "1")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()

	if res.StatusCode != http.StatusOK || string(body) != reply {
		t.Errorf("got %d %s, want 200 and the backend's body unchanged", res.StatusCode, body)
	}
	for k, want := range map[string]string{
		HeaderBackend: "b0", HeaderRoute: "first", "X-Engine": "vllm", "X-Hop": "",
		"Content-Length": strconv.Itoa(len(reply)),
	} {
		if v := res.Header.Get(k); v != want {
			t.Errorf("response header %s = %q, want %q", k, v, want)
		}
	}
	s := <-got
	if s.body != chatBody {
		t.Errorf("backend got body %s, want the client's unchanged", s.body)
	}
	if s.path != "/prefix/v1/chat/completions" || s.query != "trace=1" {
		t.Errorf("backend got %s?%s", s.path, s.query)
	}
	// The client's credentials are for the proxy, not the backend (security.go).
	if s.header.Get("Authorization") != "" || s.header.Get("X-Client-Hop") != "" ||
		s.header.Get("Accept-Encoding") != "" || s.header.Get("X-Forwarded-For") == "" {
		t.Errorf("backend got headers %v", s.header)
	}

	o := pol.outcome(t)
	if o.Status != 200 || o.PromptTokens != 21 || o.CachedTokens != 16 || o.CompletionTokens != 3 || o.Tokens != 0 {
		t.Errorf("outcome %+v, want status 200 and the usage", o)
	}
	if o.Decision.Backend != b0 || o.Request.Model != "m" || o.TTFT < 0 || o.Latency < o.TTFT {
		t.Errorf("outcome %+v", o)
	}
	be.await(t)
	px.await(t)
	assertIdle(t, b0)
}

// event reads one SSE event (through its blank line) from r.
func event(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	var ev strings.Builder
	for {
		line, err := r.ReadString('\n')
		ev.WriteString(line)
		if err != nil {
			t.Fatalf("reading event after %q: %v", ev.String(), err)
		}
		if line == "\n" {
			return ev.String()
		}
	}
}

// TestStreamingEventByEvent holds the backend between events: the client
// must get each event while the backend still holds the next, so nothing
// is buffered; and the load must be counted when routed and the prefill
// released at the first content.
func TestStreamingEventByEvent(t *testing.T) {
	events := []string{
		`data: {"id":"1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n",
		`data: {"id":"1","choices":[{"index":0,"delta":{"content":"Hi"}}]}` + "\n\n",
		`data: {"id":"1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n",
		`data: {"id":"1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}` + "\n\n",
		"data: [DONE]\n\n",
	}
	arrived := make(chan string, 1)
	next := make(chan struct{})
	be := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		arrived <- string(data)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for _, ev := range events {
			<-next
			_, _ = io.WriteString(w, ev)
			_ = rc.Flush()
		}
	}))
	b0 := testBackend(t, 0, "b0", be.URL, "m")
	pol := newFirstPolicy()
	pol.prefix = 2
	_, px := newTestProxy(t, newFakeFleet(b0), pol, nil)

	body := `{"model":"m","messages":[{"role":"user","content":"Say hi to the nice people"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":10}`
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, px.URL+"/v1/chat/completions", strings.NewReader(body))
	resc := make(chan *http.Response, 1)
	go func() {
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
		}
		resc <- res
	}()

	// The request is counted by the time it reaches the backend, before
	// anything came back.
	var up string
	select {
	case up = <-arrived:
	case <-ctx.Done():
		t.Fatal("the request did not reach the backend")
	}
	if up != body {
		t.Errorf("backend got %s, want the body unchanged (the client asked for usage)", up)
	}
	prompt := pol.lastRequest(t).PromptTokens
	if l := b0.Load(); l.Requests != 1 || l.PrefillTokens != int64(prompt-2) || l.DecodeTokens != int64(prompt+10) || l.Decoding != 0 {
		t.Errorf("load while routed %+v, want 1 request, prefill %d, decode %d", l, prompt-2, prompt+10)
	}

	// The backend sends event i only when told; the client must have it
	// before the backend is told to send event i+1.
	var rd *bufio.Reader
	for i, want := range events {
		next <- struct{}{}
		if i == 0 {
			res := <-resc
			if res == nil {
				t.FailNow()
			}
			defer res.Body.Close()
			if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" || res.Header.Get(HeaderBackend) != "b0" {
				t.Errorf("headers %v", res.Header)
			}
			rd = bufio.NewReader(res.Body)
		}
		if got := event(t, rd); got != want {
			t.Errorf("event %d = %q, want %q", i, got, want)
		}
		l := b0.Load()
		switch i {
		case 0: // role only: still prefilling
			if l.PrefillTokens != int64(prompt-2) || l.Decoding != 0 {
				t.Errorf("load after the role chunk %+v, want the prefill still counted", l)
			}
		case 1: // first content: prefill done
			if l.PrefillTokens != 0 || l.Decoding != 1 || l.Requests != 1 {
				t.Errorf("load after the first token %+v, want prefill released, decoding", l)
			}
		}
	}
	if rest, _ := io.ReadAll(rd); len(rest) != 0 {
		t.Errorf("bytes after [DONE]: %q", rest)
	}
	o := pol.outcome(t)
	if o.Tokens != 1 || o.PromptTokens != 9 || o.CachedTokens != 0 || o.CompletionTokens != 1 {
		t.Errorf("outcome %+v", o)
	}
	px.await(t)
	assertIdle(t, b0)
}

// TestStreamingHidesInjectedUsage: a client that did not ask for usage gets
// the stream as the backend would have sent it without usage, while the
// router learns the usage.
func TestStreamingHidesInjectedUsage(t *testing.T) {
	// OpenAI's own style: with include_usage every chunk has "usage":null
	// and a last chunk has the usage and no choices.
	chunks := []string{
		`{"id":"1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":null}`,
		`{"id":"1","choices":[{"index":0,"delta":{"content":"Hi"}}],"usage":null}`,
		`{"id":"1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}`,
	}
	usageChunk := `{"id":"1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":8}}}`
	var upstream atomic.Value
	be := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		upstream.Store(string(data))
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range append(slices.Clone(chunks), usageChunk, "[DONE]") {
			fmt.Fprintf(w, "data: %s\n\n", c)
		}
	}))
	b0 := testBackend(t, 0, "b0", be.URL, "m")
	pol := newFirstPolicy()
	_, px := newTestProxy(t, newFakeFleet(b0), pol, nil)

	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
	_, got := post(t, px.URL, "/v1/chat/completions", body)
	var want strings.Builder
	for _, c := range chunks {
		fmt.Fprintf(&want, "data: %s\n\n", strings.Replace(c, `,"usage":null`, "", 1))
	}
	want.WriteString("data: [DONE]\n\n")
	if got != want.String() {
		t.Errorf("client got\n%s\nwant\n%s", got, want.String())
	}
	if up := upstream.Load().(string); up != `{"stream_options":{"include_usage":true},`+body[1:] {
		t.Errorf("backend got %s, want include_usage turned on", up)
	}
	if o := pol.outcome(t); o.PromptTokens != 12 || o.CachedTokens != 8 || o.CompletionTokens != 1 || o.Tokens != 1 {
		t.Errorf("outcome %+v, want the hidden usage", o)
	}
}

// normalize blanks what differs between two runs of one emulated request:
// its id and creation time.
var normalize = regexp.MustCompile(`"(id|created)":("[^"]*"|\d+)`)

// TestStreamingEmulator streams from the emulator through the proxy and
// compares with the same request sent directly: same events, apart from
// ids; the usage chunk the proxy asked for is hidden.
func TestStreamingEmulator(t *testing.T) {
	em := startEmulator(t, "m", 0.01)
	b0 := testBackend(t, 0, "b0", em.URL, "m")
	pol := newFirstPolicy()
	_, px := newTestProxy(t, newFakeFleet(b0), pol, nil)

	body := `{"model":"m","messages":[{"role":"user","content":"Tell me a story about a proxy."}],"stream":true,"max_tokens":12}`
	res, viaProxy := post(t, px.URL, "/v1/chat/completions", body)
	_, direct := post(t, em.URL, "/v1/chat/completions", body)
	if res.StatusCode != 200 || res.Header.Get(HeaderBackend) != "b0" {
		t.Fatalf("status %d headers %v", res.StatusCode, res.Header)
	}
	if a, b := normalize.ReplaceAllString(viaProxy, ""), normalize.ReplaceAllString(direct, ""); a != b {
		t.Errorf("through the proxy:\n%s\ndirect:\n%s", viaProxy, direct)
	}
	if strings.Contains(viaProxy, `"usage"`) || !strings.HasSuffix(viaProxy, "data: [DONE]\n\n") {
		t.Errorf("stream %s shows usage or does not end in [DONE]", viaProxy)
	}
	if res.Trailer.Get(emulator.HeaderModelTTFT) == "" {
		t.Errorf("the emulator's trailers were lost: %v", res.Trailer)
	}
	o := pol.outcome(t)
	if o.Status != 200 || o.PromptTokens <= 0 || o.CompletionTokens != 12 || o.Tokens != 12 || o.CachedTokens < 0 {
		t.Errorf("outcome %+v, want the usage of 12 tokens", o)
	}
}

// TestLearnerSeesCachedTokens repeats a long prompt on the emulator: the
// second time the backend reports cached tokens, and the policy learns it,
// streaming (usage hidden from the client) or not.
func TestLearnerSeesCachedTokens(t *testing.T) {
	em := startEmulator(t, "m", 0.01)
	b0 := testBackend(t, 0, "b0", em.URL, "m")
	pol := newFirstPolicy()
	_, px := newTestProxy(t, newFakeFleet(b0), pol, nil)

	long := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 40)
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"stream %v"}],"max_tokens":4,"stream":%v}`,
			long, stream, stream)
		for turn := range 2 {
			res, got := post(t, px.URL, "/v1/chat/completions", body)
			if res.StatusCode != 200 {
				t.Fatalf("status %d: %s", res.StatusCode, got)
			}
			o := pol.outcome(t)
			if o.PromptTokens < 400 || o.CompletionTokens != 4 {
				t.Errorf("stream=%v turn %d: outcome %+v, want the usage", stream, turn, o)
			}
			if turn == 1 && o.CachedTokens < 400 {
				t.Errorf("stream=%v: repeated prompt of %d tokens had %d cached", stream, o.PromptTokens, o.CachedTokens)
			}
		}
	}
}

func TestSessionHeader(t *testing.T) {
	be, _ := recordingBackend(t, 200, nil, "{}")
	pol := newFirstPolicy()
	_, px := newTestProxy(t, newFakeFleet(testBackend(t, 0, "b0", be.URL, "m")), pol,
		func(c *Config) { c.SessionHeader = "X-Conversation" })
	body := `{"model":"m","messages":[{"role":"user","content":"x"}],"user":"u"}`
	post(t, px.URL, "/v1/chat/completions", body, "X-Conversation", "conv-1", request.DefaultSessionHeader, "ignored")
	if got := pol.lastRequest(t).SessionKey; got != "conv-1" {
		t.Errorf("SessionKey = %q, want the configured header's", got)
	}
	post(t, px.URL, "/v1/chat/completions", body)
	if got := pol.lastRequest(t).SessionKey; got != "u" {
		t.Errorf("SessionKey = %q, want the body's user", got)
	}
}

// nameBackend answers with its own name.
func nameBackend(t *testing.T, name string) *server {
	return newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"backend":%q,"path":%q}`, name, r.URL.RequestURI())
	}))
}

func TestEmbeddingsByLoad(t *testing.T) {
	var bs []*fleet.Backend
	for i := range 3 {
		name := "b" + strconv.Itoa(i)
		bs = append(bs, testBackend(t, i, name, nameBackend(t, name).URL, "e"))
	}
	var pick atomic.Int64 // what Rand returns, capped to its range
	pol := newFirstPolicy()
	_, px := newTestProxy(t, newFakeFleet(bs...), pol, func(c *Config) {
		c.Rand = func(n int) int { return min(int(pick.Load()), n-1) }
	})
	embed := func() string {
		t.Helper()
		res, body := post(t, px.URL, "/v1/embeddings", `{"model":"e","input":"hello"}`)
		if res.StatusCode != 200 || res.Header.Get(HeaderRoute) != "least-request" {
			t.Fatalf("status %d route %q: %s", res.StatusCode, res.Header.Get(HeaderRoute), body)
		}
		return res.Header.Get(HeaderBackend)
	}

	// Load b0 with two requests and b2 with one: b1 is the least loaded.
	f0, f1, f2 := bs[0].Start(0, 0), bs[0].Start(0, 0), bs[2].Start(0, 0)
	if got := embed(); got != "b1" {
		t.Errorf("routed to %s, want b1, the least loaded", got)
	}
	// With one more on b1, b1 and b2 tie: the random source decides. Reservoir sampling keeps
	// the later candidate when Rand returns 0.
	f3 := bs[1].Start(0, 0)
	pick.Store(0)
	if got := embed(); got != "b2" {
		t.Errorf("routed to %s, want b2 (Rand 0)", got)
	}
	pick.Store(1)
	if got := embed(); got != "b1" {
		t.Errorf("routed to %s, want b1 (Rand 1)", got)
	}
	f0.Done()
	f1.Done()
	f2.Done()
	f3.Done()
	if pol.asked() != 0 {
		t.Errorf("the policy was asked to route embeddings")
	}
	select {
	case o := <-pol.outcomes:
		t.Errorf("embeddings reported to the policy: %+v", o)
	default:
	}
	assertIdle(t, bs...)
}

// An embeddings request is counted under the model it names, as a chat
// request is, not under "none".
func TestEmbeddingsMetricsNameTheModel(t *testing.T) {
	b0 := testBackend(t, 0, "b0", nameBackend(t, "b0").URL, "e")
	_, px := newTestProxy(t, newFakeFleet(b0), newFirstPolicy(), nil)
	if res, body := post(t, px.URL, "/v1/embeddings", `{"model":"e","input":"hello"}`); res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	px.await(t)
	res, err := http.Get(px.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	want := `kvroute_requests_total{backend="b0",model="e",reason="least-request",status="200"} 1`
	if !strings.Contains(string(page), want) {
		t.Errorf("metrics lack %s:\n%s", want, grepLines(string(page), "kvroute_requests_total"))
	}
}

func TestOtherEndpoints(t *testing.T) {
	b0 := testBackend(t, 0, "b0", nameBackend(t, "b0").URL, "m1")
	b1 := testBackend(t, 1, "b1", nameBackend(t, "b1").URL, "m2")
	_, px := newTestProxy(t, newFakeFleet(b0, b1), newFirstPolicy(), nil)

	res, body := post(t, px.URL, "/v1/rerank?x=1", `{"model":"m2","query":"q"}`)
	if res.StatusCode != 200 || res.Header.Get(HeaderBackend) != "b1" || !strings.Contains(body, `"/v1/rerank?x=1"`) {
		t.Errorf("rerank: %d %v %s, want b1, the backend of m2, with the path and query", res.StatusCode, res.Header, body)
	}
	res, err := http.Get(px.URL + "/v1/models/m1")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get(HeaderBackend) == "" {
		t.Errorf("GET without a model: %d %v, want any healthy backend", res.StatusCode, res.Header)
	}
	b0.SetHealthy(false)
	b1.SetHealthy(false)
	if res, body := post(t, px.URL, "/v1/rerank", `{}`); res.StatusCode != 503 {
		t.Errorf("no healthy backend: %d %s, want 503", res.StatusCode, body)
	}
}

func TestModels(t *testing.T) {
	bs := []*fleet.Backend{
		testBackend(t, 0, "b0", "http://b0", "llama", "qwen"),
		testBackend(t, 1, "b1", "http://b1", "qwen", "mistral"),
		testBackend(t, 2, "b2", "http://b2"),
	}
	_, px := newTestProxy(t, newFakeFleet(bs...), newFirstPolicy(), nil)
	res, err := http.Get(px.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			OwnedBy string `json:"owned_by"`
			Created int64  `json:"created"`
		} `json:"data"`
	}
	if err := json.NewDecoder(res.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
		if m.Object != "model" || m.OwnedBy != "kvroute" || m.Created == 0 {
			t.Errorf("model %+v", m)
		}
	}
	if list.Object != "list" || !slices.Equal(ids, []string{"llama", "mistral", "qwen"}) {
		t.Errorf("models %+v, want the union llama, mistral, qwen", list)
	}
}

func TestHealthAndReady(t *testing.T) {
	f := newFakeFleet(testBackend(t, 0, "b0", "http://b0", "m"))
	_, px := newTestProxy(t, f, newFirstPolicy(), nil)
	get := func(path string) int {
		res, err := http.Get(px.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if get("/healthz") != 200 || get("/health") != 200 || get("/readyz") != 200 {
		t.Error("a ready fleet is not healthy and ready")
	}
	f.notReady.Store(true)
	if get("/healthz") != 200 || get("/readyz") != 503 {
		t.Error("want healthz 200 and readyz 503 when the fleet is not ready")
	}
}

// openAIError decodes an OpenAI-shaped error body.
func openAIError(t *testing.T, body string) (msg, typ, code string) {
	t.Helper()
	var e struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == nil || e.Error.Message == "" {
		t.Fatalf("body %q is not an OpenAI error", body)
	}
	if e.Error.Code != nil {
		code = *e.Error.Code
	}
	return e.Error.Message, e.Error.Type, code
}

func TestBadInput(t *testing.T) {
	be, got := recordingBackend(t, 200, nil, "{}")
	down := testBackend(t, 1, "down", be.URL, "sick")
	down.SetHealthy(false)
	f := newFakeFleet(testBackend(t, 0, "b0", be.URL, "m"), down)
	at := time.Unix(1e9, 0) // a clock that stands still: limits do not refill
	_, px := newTestProxy(t, f, newFirstPolicy(), func(c *Config) {
		c.MaxBodyBytes = 1024
		c.Now = func() time.Time { return at }
		c.Security.APIKeys = []auth.APIKey{{Key: "good", Name: "good"}, {Key: "spent", Name: "spent", RPM: 1}, {Key: "small", Name: "small", TPM: 4}}
	})
	// Every request carries the good key but for the cases about keys.
	auth := map[string]string{"missing key": "", "wrong key": "Bearer nope", "key not bearer": "Basic Z29vZA==",
		"rate-limited key": "Bearer spent", "request over the key's tokens per minute": "Bearer small"}
	if res, body := get(t, px.URL, "/v1/models", "Bearer spent"); res.StatusCode != 200 { // spend its one request
		t.Fatalf("first request of a key: %d %s", res.StatusCode, body)
	}
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}`

	tests := []struct {
		name, method, path, body string
		chunked                  bool
		wantStatus               int
		wantType, wantCode       string
	}{
		{"malformed JSON", "POST", "/v1/chat/completions", `{"model":"m",`, false, 400, typeInvalidRequest, codeInvalidJSON},
		{"not an object", "POST", "/v1/completions", `"hi"`, false, 400, typeInvalidRequest, codeInvalidJSON},
		{"empty body", "POST", "/v1/chat/completions", ``, false, 400, typeInvalidRequest, codeInvalidJSON},
		{"missing model", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`, false, 400, typeInvalidRequest, ""},
		{"model not a string", "POST", "/v1/chat/completions", `{"model":["m"],"messages":[{"role":"user","content":"x"}]}`, false, 400, typeInvalidRequest, ""},
		{"missing messages", "POST", "/v1/chat/completions", `{"model":"m"}`, false, 400, typeInvalidRequest, ""},
		{"messages not an array", "POST", "/v1/chat/completions", `{"model":"m","messages":{}}`, false, 400, typeInvalidRequest, ""},
		{"missing prompt", "POST", "/v1/completions", `{"model":"m"}`, false, 400, typeInvalidRequest, ""},
		{"embeddings without model", "POST", "/v1/embeddings", `{"input":"x"}`, false, 400, typeInvalidRequest, ""},
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, false, 404, typeInvalidRequest, codeModelNotFound},
		{"unknown embedding model", "POST", "/v1/embeddings", `{"model":"gpt-9","input":"x"}`, false, 404, typeInvalidRequest, codeModelNotFound},
		{"model with no healthy backend", "POST", "/v1/completions", `{"model":"sick","prompt":"x"}`, false, 503, typeServer, codeUnavailable},
		{"wrong method", "GET", "/v1/chat/completions", ``, false, 405, typeInvalidRequest, codeMethodNotAllowed},
		{"wrong method on models", "DELETE", "/v1/models", ``, false, 405, typeInvalidRequest, codeMethodNotAllowed},
		{"body too large", "POST", "/v1/chat/completions", big, false, 413, typeInvalidRequest, codeTooLarge},
		{"chunked body too large", "POST", "/v1/chat/completions", big, true, 413, typeInvalidRequest, codeTooLarge},
		{"unknown path", "POST", "/v2/chat/completions", chatBody, false, 404, typeInvalidRequest, codeUnknownURL},
		// Security (security.go): admin paths, ambiguous paths, keys and limits.
		{"admin path load_lora_adapter", "POST", "/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"/etc"}`, false, 404, typeInvalidRequest, codeUnknownURL},
		{"admin path unload_lora_adapter", "POST", "/v1/unload_lora_adapter", `{"lora_name":"x"}`, false, 404, typeInvalidRequest, codeUnknownURL},
		{"admin path files", "GET", "/v1/files/file-1/content", ``, false, 404, typeInvalidRequest, codeUnknownURL},
		{"admin path sleep", "POST", "/sleep", ``, false, 404, typeInvalidRequest, codeUnknownURL},
		{"admin path wake_up", "POST", "/wake_up", ``, false, 404, typeInvalidRequest, codeUnknownURL},
		{"allowed path with a suffix", "POST", "/v1/chat/completionsx", chatBody, false, 404, typeInvalidRequest, codeUnknownURL},
		{"models subtree is read-only", "DELETE", "/v1/models/m", ``, false, 405, typeInvalidRequest, codeMethodNotAllowed},
		{"dot-dot segment", "POST", "/v1/models/../load_lora_adapter", `{}`, false, 400, typeInvalidRequest, "invalid_path"},
		{"dot segment", "POST", "/v1/./chat/completions", chatBody, false, 400, typeInvalidRequest, "invalid_path"},
		{"encoded dot-dot", "POST", "/v1/models/%2e%2E/load_lora_adapter", `{}`, false, 400, typeInvalidRequest, "invalid_path"},
		{"half-encoded dot-dot", "POST", "/v1/models/.%2e/load_lora_adapter", `{}`, false, 400, typeInvalidRequest, "invalid_path"},
		{"encoded slash", "POST", "/v1/chat%2Fcompletions", chatBody, false, 400, typeInvalidRequest, "invalid_path"},
		{"encoded backslash", "POST", "/v1/models%5c..%5cload_lora_adapter", `{}`, false, 400, typeInvalidRequest, "invalid_path"},
		{"double encoding", "POST", "/v1/models/%252e%252e/load_lora_adapter", `{}`, false, 400, typeInvalidRequest, "invalid_path"},
		{"double slash", "POST", "/v1//chat/completions", chatBody, false, 400, typeInvalidRequest, "invalid_path"},
		{"encoded NUL", "GET", "/v1/models/m%00", ``, false, 400, typeInvalidRequest, "invalid_path"},
		{"missing key", "POST", "/v1/chat/completions", chatBody, false, 401, typeInvalidRequest, codeInvalidAPIKey},
		{"wrong key", "POST", "/v1/chat/completions", chatBody, false, 401, typeInvalidRequest, codeInvalidAPIKey},
		{"key not bearer", "GET", "/v1/models", ``, false, 401, typeInvalidRequest, codeInvalidAPIKey},
		{"rate-limited key", "POST", "/v1/chat/completions", chatBody, false, 429, typeRequests, codeRateLimited},
		{"request over the key's tokens per minute", "POST", "/v1/chat/completions", chatBody, false, 429, typeTokens, codeRateLimited},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rd io.Reader = strings.NewReader(tt.body)
			if tt.chunked {
				rd = io.MultiReader(rd) // hides the length: sent chunked
			}
			req, _ := http.NewRequest(tt.method, px.URL+tt.path, rd)
			if a, ok := auth[tt.name]; !ok {
				req.Header.Set("Authorization", "Bearer good")
			} else if a != "" {
				req.Header.Set("Authorization", a)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != tt.wantStatus {
				t.Errorf("status %d, want %d: %s", res.StatusCode, tt.wantStatus, data)
			}
			if ct := res.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			_, typ, code := openAIError(t, string(data))
			if typ != tt.wantType || (tt.wantCode != "" && code != tt.wantCode) {
				t.Errorf("type %q code %q, want %q %q", typ, code, tt.wantType, tt.wantCode)
			}
			if tt.wantStatus == 405 && res.Header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
			if tt.name == "rate-limited key" && res.Header.Get("Retry-After") == "" {
				t.Error("429 without Retry-After")
			}
			if tt.wantStatus == 401 && strings.Contains(string(data), "nope") {
				t.Errorf("the 401 repeats the key: %s", data)
			}
		})
	}
	select {
	case s := <-got:
		t.Errorf("a bad request reached the backend: %+v", s)
	default:
	}
}

func TestPolicyErrors(t *testing.T) {
	be, _ := recordingBackend(t, 200, nil, "{}")
	pol := newFirstPolicy()
	pol.err = fmt.Errorf("all full: %w", router.ErrNoBackend)
	_, px := newTestProxy(t, newFakeFleet(testBackend(t, 0, "b0", be.URL, "m")), pol, nil)
	res, body := post(t, px.URL, "/v1/chat/completions", chatBody)
	if _, typ, code := openAIError(t, body); res.StatusCode != 503 || typ != typeServer || code != codeUnavailable {
		t.Errorf("ErrNoBackend: %d %s, want 503", res.StatusCode, body)
	}
	pol.err = errors.New("bug")
	if res, body := post(t, px.URL, "/v1/chat/completions", chatBody); res.StatusCode != 500 {
		t.Errorf("policy failure: %d %s, want 500", res.StatusCode, body)
	}
}

// TestClientDisconnect: a client that goes away mid-stream cancels the
// backend's request at once.
func TestClientDisconnect(t *testing.T) {
	cancelled := make(chan struct{})
	be := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"choices":[{"delta":{"content":"Hi"}}]}`+"\n\n")
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done()
		close(cancelled)
	}))
	b0 := testBackend(t, 0, "b0", be.URL, "m")
	pol := newFirstPolicy()
	p, px := newTestProxy(t, newFakeFleet(b0), pol, nil)

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, px.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	event(t, bufio.NewReader(res.Body))
	cancel()
	res.Body.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the backend's request was not cancelled")
	}
	px.await(t)
	assertIdle(t, b0)
	if o := pol.outcome(t); o.Status != 200 || o.Tokens != 1 {
		t.Errorf("outcome %+v", o)
	}
	if got := counterValue(t, p, "kvroute_requests_total", "backend", "b0", "status", statusClientClosed); got != 1 {
		t.Errorf("requests_total{status=499} = %v, want 1", got)
	}
}

// TestClientDisconnectEmulator: the emulator stops generating for a client
// that left: its running requests go back to zero.
func TestClientDisconnectEmulator(t *testing.T) {
	em := startEmulator(t, "m", 1) // real time: 2000 tokens would take seconds
	b0 := testBackend(t, 0, "b0", em.URL, "m")
	_, px := newTestProxy(t, newFakeFleet(b0), newFirstPolicy(), nil)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, px.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"Write a long essay."}],"stream":true,"max_tokens":2000}`))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(res.Body)
	event(t, rd) // the role
	event(t, rd) // a token: it is generating
	if running := emulatorMetric(t, em.URL, "vllm:num_requests_running"); running != 1 {
		t.Errorf("running = %v, want 1 while streaming", running)
	}
	em.await(t) // the /metrics call's handler
	cancel()
	res.Body.Close()
	em.await(t) // the emulator's handler returned: it saw the cancellation
	px.await(t)
	if running := emulatorMetric(t, em.URL, "vllm:num_requests_running"); running != 0 {
		t.Errorf("running = %v after the client left, want 0", running)
	}
	if aborted := emulatorMetric(t, em.URL, `vllm:request_success_total{finished_reason="abort"`); aborted != 1 {
		t.Errorf("aborted = %v, want 1", aborted)
	}
	assertIdle(t, b0)
}

// emulatorMetric reads the first sample of the emulator's /metrics whose
// line starts with prefix.
func emulatorMetric(t *testing.T, base, prefix string) float64 {
	t.Helper()
	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, prefix) {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("no metric %s", prefix)
	return 0
}

// deadURL is the address of a server that has gone: connections are
// refused. The port stays taken until the test ends (deadPort): a port
// merely closed may be handed to the next listener, and when that was the
// test's own proxy, the proxy sent the dead backend's requests to itself,
// DefaultMaxPerBackend deep, until newServer's done channel filled and 156
// of them waited for an answer for good (a CI run's TestDeadBackendRetried).
func deadURL(t *testing.T) string {
	return "http://" + deadPort(t)
}

func TestDeadBackendRetried(t *testing.T) {
	dead := testBackend(t, 0, "dead", deadURL(t), "m")
	live := testBackend(t, 1, "live", nameBackend(t, "live").URL, "m")
	f := newFakeFleet(dead, live)
	pol := newFirstPolicy()
	p, px := newTestProxy(t, f, pol, nil)

	res, body := post(t, px.URL, "/v1/chat/completions", chatBody)
	if res.StatusCode != 200 || res.Header.Get(HeaderBackend) != "live" {
		t.Fatalf("got %d from %q: %s, want 200 from live", res.StatusCode, res.Header.Get(HeaderBackend), body)
	}
	if err := f.failure("dead"); err == nil || !isDialError(err) || dead.Healthy() {
		t.Errorf("dead backend: failure %v, healthy %v; want marked failed with its dial error", err, dead.Healthy())
	}
	first, second := pol.outcome(t), pol.outcome(t)
	if first.Decision.Backend != dead || first.Status != 0 || second.Decision.Backend != live || second.Status != 200 {
		t.Errorf("outcomes %+v then %+v, want dead unanswered then live 200", first, second)
	}
	assertIdle(t, dead, live)
	if got := counterValue(t, p, "kvroute_backend_failures_total", "backend", "dead", "kind", "dial"); got != 1 {
		t.Errorf("dial failures = %v, want 1", got)
	}
}

func TestAllBackendsDead(t *testing.T) {
	bs := []*fleet.Backend{
		testBackend(t, 0, "d0", deadURL(t), "m"),
		testBackend(t, 1, "d1", deadURL(t), "m"),
		testBackend(t, 2, "d2", deadURL(t), "m"),
		testBackend(t, 3, "d3", deadURL(t), "m"),
	}
	f := newFakeFleet(bs...)
	_, px := newTestProxy(t, f, newFirstPolicy(), nil)
	res, body := post(t, px.URL, "/v1/chat/completions", chatBody)
	if _, typ, code := openAIError(t, body); res.StatusCode != 502 || typ != typeServer || code != codeBackendUnreachable {
		t.Errorf("got %d %s, want 502 backend_unreachable", res.StatusCode, body)
	}
	if strings.Contains(string(body), "127.0.0.1") {
		t.Errorf("the error names a backend's address: %s", body)
	}
	// DefaultMaxAttempts backends, not a sweep of the fleet.
	if f.failure("d0") == nil || f.failure("d1") == nil || f.failure("d2") == nil || f.failure("d3") != nil {
		t.Errorf("failures d0 %v d1 %v d2 %v d3 %v, want the first three", f.failure("d0"), f.failure("d1"), f.failure("d2"), f.failure("d3"))
	}
	// Now no candidate is left healthy but d3, and it is dead too.
	res, body = post(t, px.URL, "/v1/chat/completions", chatBody)
	if res.StatusCode != 502 {
		t.Errorf("got %d %s, want 502", res.StatusCode, body)
	}
	res, body = post(t, px.URL, "/v1/chat/completions", chatBody)
	if res.StatusCode != 503 {
		t.Errorf("got %d %s with every backend out, want 503", res.StatusCode, body)
	}
	assertIdle(t, bs...)
}

// TestBackendFailsMidResponse: a backend that breaks off after part of its
// response reached the client ends a stream with an OpenAI-shaped error
// event and the end-of-stream marker, so the client knows why and is not
// left with a cut connection; a non-streamed response cut short aborts the
// client's connection, so the client cannot take it for a whole one.
func TestBackendFailsMidResponse(t *testing.T) {
	for _, tt := range []struct {
		name   string
		stream bool
	}{{"stream", true}, {"whole", false}} {
		t.Run(tt.name, func(t *testing.T) {
			be := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.stream {
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = io.WriteString(w, `data: {"choices":[{"delta":{"content":"Hi"}}]}`+"\n\n")
				} else {
					w.Header().Set("Content-Type", "application/json")
					_, _ = io.WriteString(w, `{"choices":[{"message":`)
				}
				_ = http.NewResponseController(w).Flush()
				panic(http.ErrAbortHandler) // drop the connection mid-response
			}))
			b0 := testBackend(t, 0, "b0", be.URL, "m")
			p, px := newTestProxy(t, newFakeFleet(b0), newFirstPolicy(), nil)

			body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":%v}`, tt.stream)
			req, _ := http.NewRequest(http.MethodPost, px.URL+"/v1/chat/completions", strings.NewReader(body))
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(res.Body)
			res.Body.Close()
			if tt.stream {
				want := `data: {"choices":[{"delta":{"content":"Hi"}}]}` + "\n\n" +
					`data: {"error":{"message":"backend b0 failed mid-response (connection closed)","type":"server_error","param":null,"code":"backend_error"}}` + "\n\n" +
					"data: [DONE]\n\n"
				if err != nil || string(data) != want {
					t.Errorf("the client read %q (err %v), want %q", data, err, want)
				}
			} else if err == nil {
				t.Errorf("the client read a complete response %q, want its connection aborted", data)
			}
			px.await(t)
			assertIdle(t, b0)
			if got := counterValue(t, p, "kvroute_backend_failures_total", "backend", "b0", "kind", "read"); got != 1 {
				t.Errorf("read failures = %v, want 1", got)
			}
			if got := counterValue(t, p, "kvroute_responses_cut_total", "backend", "b0", "reason", "read"); got != 1 {
				t.Errorf("responses cut = %v, want 1", got)
			}
		})
	}
}

// counterValue reads a counter from the proxy's /metrics page.
func counterValue(t *testing.T, p *Proxy, name string, labels ...string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			ok = ok && strings.Contains(line, labels[i]+`="`+labels[i+1]+`"`)
		}
		if ok {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			return v
		}
	}
	return 0
}

func TestMetrics(t *testing.T) {
	const reply = `{"choices":[],"usage":{"prompt_tokens":30,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":16}}}`
	be, _ := recordingBackend(t, 200, http.Header{"Content-Type": {"application/json"}}, reply)
	b0 := testBackend(t, 0, "b0", be.URL, "m")
	b1 := testBackend(t, 1, "b1", "http://127.0.0.1:1", "m2") // known at start, never asked
	pol := newFirstPolicy()
	pol.prefix = 5
	_, px := newTestProxy(t, newFakeFleet(b0, b1), pol, nil)
	post(t, px.URL, "/v1/chat/completions", chatBody)
	post(t, px.URL, "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`)
	px.await(t)
	px.await(t)

	res, err := http.Get(px.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		`kvroute_requests_total{backend="b0",model="m",reason="first",status="200"} 1`,
		`kvroute_requests_total{backend="none",model="none",reason="none",status="404"} 1`,
		`kvroute_inflight_requests{backend="b0"} 0`,
		`kvroute_inflight_prefill_tokens{backend="b0"} 0`,
		`kvroute_ttft_seconds_count{backend="b0",model="m"} 1`,
		`kvroute_e2e_seconds_count{backend="b0",model="m"} 1`,
		`kvroute_ttft_seconds_count{backend="b1",model="m2"} 0`,
		`kvroute_e2e_seconds_count{backend="b1",model="m2"} 0`,
		`kvroute_predicted_cached_tokens_total{backend="b0"} 5`,
		`kvroute_reported_cached_tokens_total{backend="b0"} 16`,
		`kvroute_prompt_tokens_total{backend="b0"} 30`,
		`kvroute_decision_seconds_count 1`,
		`go_goroutines`,
		// Series known at start exist before their first event.
		`kvroute_backend_failures_total{backend="b1",kind="dial"} 0`,
		`kvroute_retries_total{backend="b1",reason="timeout"} 0`,
		`kvroute_timeouts_total{backend="b1",kind="first_token"} 0`,
		`kvroute_responses_cut_total{backend="b1",reason="idle"} 0`,
		`kvroute_reported_cached_tokens_total{backend="b1"} 0`,
	} {
		if !strings.Contains(string(page), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestMetricsOwnRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := newFakeFleet(testBackend(t, 0, "b0", "http://b0", "m"))
	p, err := New(Config{Fleet: f, Router: routerOf(newFirstPolicy()), Registerer: reg, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != 404 {
		t.Errorf("/metrics = %d with the caller's registry, want 404 (the caller serves it)", rec.Code)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		found = found || mf.GetName() == "kvroute_inflight_requests"
	}
	if !found {
		t.Error("the caller's registry lacks kvroute_inflight_requests")
	}
	if _, err := New(Config{Fleet: f, Router: routerOf(newFirstPolicy()), Registerer: reg}); err == nil {
		t.Error("a second proxy on one registry: no error")
	}
}

func TestNewRequiresFleetAndPolicy(t *testing.T) {
	if _, err := New(Config{Router: routerOf(newFirstPolicy())}); err == nil {
		t.Error("no error without a fleet")
	}
	if _, err := New(Config{Fleet: newFakeFleet()}); err == nil {
		t.Error("no error without a policy")
	}
}

// TestExplainHeaders: with Config.Explain a response names the policy's
// predicted cached tokens, TTFT and time between tokens; without it, it does not (they tell a
// client what the fleet holds). The predicted TTFT in seconds is always
// sent.
func TestExplainHeaders(t *testing.T) {
	be := nameBackend(t, "b0")
	for _, explain := range []bool{false, true} {
		pol := newFirstPolicy()
		pol.prefix, pol.predict = 12, 250*time.Millisecond
		_, px := newTestProxy(t, newFakeFleet(testBackend(t, 0, "b0", be.URL, "m")), pol, func(c *Config) { c.Explain = explain })
		res, body := post(t, px.URL, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a prompt of some tokens"}]}`)
		if res.StatusCode != 200 {
			t.Fatalf("status %d: %s", res.StatusCode, body)
		}
		cached, ttft, itl := res.Header.Get(HeaderPredictedCached), res.Header.Get(HeaderPredictedTTFT), res.Header.Get(HeaderPredictedITL)
		if explain && (cached == "" || cached == "0" || ttft != "250.0" || itl != "0.01250") || !explain && (cached != "" || ttft != "" || itl != "") {
			t.Errorf("Explain %v: predicted cached %q, TTFT %q, ITL %q", explain, cached, ttft, itl)
		}
		// The prediction the request was routed on goes out either way.
		if got := res.Header.Get(HeaderPredictedTTFTSeconds); got != "0.2500" {
			t.Errorf("Explain %v: %s %q, want 0.2500", explain, HeaderPredictedTTFTSeconds, got)
		}
	}
}
