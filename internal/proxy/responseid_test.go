package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/internal/router"
)

// storingBackend answers the Responses API as vLLM does: it stores the
// responses it produces, echoes previous_response_id and answers 404 for
// one it did not produce. got receives each request's
// previous_response_id as the backend saw it.
type storingBackend struct {
	name string
	got  chan string

	mu     sync.Mutex
	stored map[string]bool
}

func (sb *storingBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	data, _ := io.ReadAll(r.Body)
	var req struct {
		Prev   *string `json:"previous_response_id"`
		Stream bool    `json:"stream"`
	}
	_ = json.Unmarshal(data, &req)
	prev, prevJSON := "", "null"
	if req.Prev != nil {
		prev, prevJSON = *req.Prev, strconv.Quote(*req.Prev)
	}
	sb.got <- prev
	sb.mu.Lock()
	known := sb.stored[prev]
	id := fmt.Sprintf("resp_%s_%d", sb.name, len(sb.stored))
	if prev == "" || known {
		sb.stored[id] = true
	}
	sb.mu.Unlock()
	if prev != "" && !known {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":"previous_response_id"}}`, prev)
		return
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, responseObject(id, prevJSON, "completed"))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ev := range responseEvents(id, prevJSON) {
		_, _ = io.WriteString(w, ev)
		_ = http.NewResponseController(w).Flush()
	}
}

func responseObject(id, prevJSON, status string) string {
	return fmt.Sprintf(`{"id":%q,"object":"response","status":%q,"previous_response_id":%s,"output":[{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"Hi"}]}],`+
		`"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":4},"output_tokens":1,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":10}}`, id, status, prevJSON)
}

func responseEvents(id, prevJSON string) []string {
	return []string{
		fmt.Sprintf("event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":%s}\n\n", responseObject(id, prevJSON, "in_progress")),
		fmt.Sprintf("event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":%s}\n\n", responseObject(id, prevJSON, "in_progress")),
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n",
		fmt.Sprintf("event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":%s}\n\n", responseObject(id, prevJSON, "completed")),
	}
}

// Two proxies with routers of their own (two replicas sharing nothing):
// the ids the client sees name the backend that stores the response, so
// that a continuation sent to the other replica goes there, and the
// backend gets its own ids back; ids kvroute did not mint pass as they
// are.
func TestResponseIDsAcrossReplicas(t *testing.T) {
	sb0 := &storingBackend{name: "b0", got: make(chan string, 10), stored: map[string]bool{}}
	sb1 := &storingBackend{name: "b1", got: make(chan string, 10), stored: map[string]bool{}}
	be0, be1 := newServer(t, sb0), newServer(t, sb1)
	b0 := testBackend(t, 0, "b0", be0.URL, "m")
	b1 := testBackend(t, 1, "b1", be1.URL, "m")
	pinning := func(pol router.Policy) func(*Config) {
		return func(c *Config) { c.Router = router.NewPinningRouter(pol, nil, 0) }
	}
	// Replica A sees only b1; replica B would pick b0 first.
	_, pxA := newTestProxy(t, newFakeFleet(b1), newFirstPolicy(), pinning(newFirstPolicy()))
	_, pxB := newTestProxy(t, newFakeFleet(b0, b1), newFirstPolicy(), pinning(newFirstPolicy()))
	mint := router.NewPinningRouter(nil, nil, 0).MintResponseID

	res, got := post(t, pxA.URL, "/v1/responses", `{"model":"m","input":"Hi"}`)
	first := mint("resp_b1_0", b1)
	if res.StatusCode != http.StatusOK || got != responseObject(first, "null", "completed") {
		t.Fatalf("A: status %d, body %s; want the id %s", res.StatusCode, got, first)
	}
	if cl := res.Header.Get("Content-Length"); cl != strconv.Itoa(len(got)) {
		t.Errorf("Content-Length %s, body of %d bytes", cl, len(got))
	}
	if prev := <-sb1.got; prev != "" {
		t.Errorf("b1 got previous_response_id %q", prev)
	}

	// B did not see it: the id alone sends the streamed continuation to b1.
	res, got = post(t, pxB.URL, "/v1/responses", `{"model":"m","input":"More","stream":true,"previous_response_id":"`+first+`"}`)
	second := mint("resp_b1_1", b1)
	want := strings.Join(responseEvents(second, strconv.Quote(first)), "")
	if res.StatusCode != http.StatusOK || res.Header.Get(HeaderBackend) != "b1" || got != want {
		t.Fatalf("B: status %d from %s, body\n%s\nwant\n%s", res.StatusCode, res.Header.Get(HeaderBackend), got, want)
	}
	if prev := <-sb1.got; prev != "resp_b1_0" {
		t.Errorf("b1 got previous_response_id %q, want its own resp_b1_0", prev)
	}

	// Back on A, non-streamed: A did not see the second response either.
	res, got = post(t, pxA.URL, "/v1/responses", `{"model":"m","input":"Again","previous_response_id":"`+second+`"}`)
	if res.StatusCode != http.StatusOK || got != responseObject(mint("resp_b1_2", b1), strconv.Quote(second), "completed") {
		t.Errorf("A again: status %d, body %s", res.StatusCode, got)
	}
	if prev := <-sb1.got; prev != "resp_b1_1" {
		t.Errorf("b1 got previous_response_id %q, want resp_b1_1", prev)
	}

	// An id kvroute did not mint reaches the backend unchanged, and so does
	// the backend's 404 about it.
	res, got = post(t, pxB.URL, "/v1/responses", `{"model":"m","input":"Hi","previous_response_id":"resp_b1_0"}`)
	if res.StatusCode != http.StatusNotFound || !strings.Contains(got, "'resp_b1_0'") {
		t.Errorf("an id not minted: status %d, body %s; want b0's 404", res.StatusCode, got)
	}
	if prev := <-sb0.got; prev != "resp_b1_0" {
		t.Errorf("b0 got previous_response_id %q, want resp_b1_0 unchanged", prev)
	}
}

// BenchmarkResponsesIDs is a streamed Responses API continuation of 64
// deltas through the proxy, its ids kept as they are (no response pins)
// and mapped (the id minted in every event that carries it, the
// previous_response_id mapped back): the difference is what the mapping
// costs a request.
func BenchmarkResponsesIDs(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(responseEvents("resp_0123456789abcdef0123456789abcdef", `"resp_prev"`)[0])
	for range 64 {
		sb.WriteString("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\" word\"}\n\n")
	}
	sb.WriteString(responseEvents("resp_0123456789abcdef0123456789abcdef", `"resp_prev"`)[3])
	stream := sb.String()
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
	b0 := testBackend(b, 0, "b0", be.URL, "m")
	prev := router.NewPinningRouter(nil, nil, 0).MintResponseID("resp_prev", b0)
	body := `{"model":"m","input":"Hello there","stream":true,"previous_response_id":"` + prev + `"}`
	for _, tc := range []struct {
		name string
		r    *router.Router
	}{{"kept", router.NewRouter(firstOnly{}, nil)}, {"mapped", router.NewPinningRouter(firstOnly{}, nil, 0)}} {
		p, err := New(Config{Fleet: newFakeFleet(b0), Router: tc.r, Logger: discard})
		if err != nil {
			b.Fatal(err)
		}
		px := httptest.NewServer(p)
		defer px.Close()
		b.Run(tc.name, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			defer client.CloseIdleConnections()
			b.ReportAllocs()
			for b.Loop() {
				res, err := client.Post(px.URL+"/v1/responses", "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != 200 || n == 0 {
					b.Fatalf("status %d, %d bytes", res.StatusCode, n)
				}
			}
		})
	}
}
