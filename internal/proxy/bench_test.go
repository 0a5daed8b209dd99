package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

const benchReply = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":21,"completion_tokens":9,"total_tokens":30,"prompt_tokens_details":{"cached_tokens":16}}}`

// benchEvents is a stream of n content chunks, the usage chunk and [DONE].
func benchEvents(n int) string {
	var b strings.Builder
	b.WriteString(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	for range n {
		b.WriteString(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	}
	b.WriteString(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":21,"completion_tokens":` +
		strconv.Itoa(n) + `,"prompt_tokens_details":{"cached_tokens":16}}}` + "\n\n")
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// benchRoundTrip measures a client's request to target (the backend itself
// or the proxy in front of it), body read to the end.
func benchRoundTrip(b *testing.B, target, body string) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		res, err := client.Post(target+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || n == 0 {
			b.Fatalf("status %d, %d bytes", res.StatusCode, n)
		}
	}
}

// BenchmarkRoundTrip is a non-streaming chat request against a trivial
// backend, directly and through the proxy: the difference is the proxy's
// cost per request (parse, route, account, forward, read usage).
func BenchmarkRoundTrip(b *testing.B) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, benchReply)
	}))
	defer be.Close()
	_, px := newBenchProxy(b, be.URL)
	defer px.Close()
	b.Run("direct", func(b *testing.B) { benchRoundTrip(b, be.URL, chatBody) })
	b.Run("proxy", func(b *testing.B) { benchRoundTrip(b, px.URL, chatBody) })
}

// BenchmarkStream is a streamed chat request of 64 chunks, directly and
// through the proxy, which asks for and hides the usage chunk.
func BenchmarkStream(b *testing.B) {
	stream := benchEvents(64)
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for ev := range strings.SplitAfterSeq(stream, "\n\n") {
			_, _ = io.WriteString(w, ev)
			_ = rc.Flush()
		}
	}))
	defer be.Close()
	_, px := newBenchProxy(b, be.URL)
	defer px.Close()
	body := `{"model":"m","messages":[{"role":"user","content":"Hello there"}],"stream":true}`
	b.Run("direct", func(b *testing.B) { benchRoundTrip(b, be.URL, body) })
	b.Run("proxy", func(b *testing.B) { benchRoundTrip(b, px.URL, body) })
}

func newBenchProxy(b *testing.B, backend string) (*Proxy, *httptest.Server) {
	p, err := New(Config{
		Fleet:  newFakeFleet(testBackend(b, 0, "b0", backend, "m")),
		Router: routerOf(firstOnly{}),
		Logger: discard,
	})
	if err != nil {
		b.Fatal(err)
	}
	return p, httptest.NewServer(p)
}

// firstOnly picks the first candidate and records nothing: the cheapest
// policy, so that the benchmarks measure the proxy.
type firstOnly struct{}

func (firstOnly) Name() string { return "first-only" }

func (firstOnly) Pick(_ *router.Request, cands []*fleet.Backend) (router.Decision, error) {
	return router.Decision{Backend: cands[0], Reason: "first"}, nil
}
