package llamacpp

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/proxy"
)

// llamaStream is one streamed chat answer from llama-server (or kvroute in
// front of it) as its client saw it.
type llamaStream struct {
	text       string
	finish     string
	errorEvent bool
	done       bool
	// backend is the router's X-Kvroute-Backend: the backend that began
	// the stream.
	backend string
	err     error
}

var freshConn = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// streamGreedy streams a greedy chat answer of maxTokens tokens to messages
// (JSON) from url.
func streamGreedy(url, messages string, maxTokens int, extra string) llamaStream {
	return streamLlama(url+"/v1/chat/completions", fmt.Sprintf(`{"model":"random-llama","messages":%s,"max_tokens":%d,"temperature":0,"seed":1,"ignore_eos":true,"stream":true%s}`,
		messages, maxTokens, extra))
}

// completeGreedy streams a greedy completion of maxTokens tokens of prompt
// from url.
func completeGreedy(url, prompt string, maxTokens int) llamaStream {
	return streamLlama(url+"/v1/completions", fmt.Sprintf(`{"model":"random-llama","prompt":%q,"max_tokens":%d,"temperature":0,"seed":1,"ignore_eos":true,"stream":true}`,
		prompt, maxTokens))
}

// streamLlama posts body to endpoint and reads the stream, chat or
// completion, to its end.
func streamLlama(endpoint, body string) llamaStream {
	// A fresh connection each time: llama-server may close a kept-alive one
	// between streams, and a POST on a connection closed under it fails
	// with EOF rather than being retried.
	res, err := freshConn.Post(endpoint, "application/json", strings.NewReader(body))
	if err != nil {
		return llamaStream{err: err}
	}
	defer res.Body.Close()
	s := llamaStream{backend: res.Header.Get(proxy.HeaderBackend)}
	var b strings.Builder
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			s.done = true
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				Text         string  `json:"text"` // a completion's
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			s.err = err
			return s
		}
		if c.Error != nil {
			s.errorEvent = true
		}
		for _, ch := range c.Choices {
			b.WriteString(ch.Delta.Content)
			b.WriteString(ch.Text)
			if ch.FinishReason != nil {
				s.finish = *ch.FinishReason
			}
		}
	}
	s.text = b.String()
	if s.err == nil {
		s.err = sc.Err()
	}
	return s
}

// Migration against real llama-servers: llama.cpp continues a final
// assistant message in place (its assistant prefill, on by default; it
// ignores vLLM's continue_final_message), and a completion's prompt
// followed by the text so far, so the chat and completion streams whose
// server is killed mid-way complete on the other with no error event, and
// with greedy decoding their text is the uninterrupted run's. That holds as far as
// the text sent re-tokenizes to the tokens generated, as the random-weight
// model's repetitive output does; a mismatch is logged, not failed.
func TestLlamaServerMigration(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real llama-servers")
	}
	in := Require(t)
	model, err := in.Model(DefaultModel())
	if err != nil {
		t.Fatal(err)
	}
	// Chats, then completions, each with a slot of its own on either server.
	const chats, n, tokens = 3, 5, 400
	var servers []*Server
	var urls []string
	for range 2 {
		s, err := in.Start(t.Context(), ServerConfig{Model: model, Context: 8192, Slots: n, Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		servers, urls = append(servers, s), append(urls, s.URL)
	}
	msgs := func(i int) string {
		return fmt.Sprintf(`[{"role":"user","content":"request %d: tell me a story"}]`, i)
	}
	play := func(url string, i int) llamaStream {
		if i < chats {
			return streamGreedy(url, msgs(i), tokens, "")
		}
		return completeGreedy(url, fmt.Sprintf("Request %d. Once upon a time", i), tokens)
	}
	// The uninterrupted runs, at once as the migrated ones will run.
	ref := make([]llamaStream, n)
	var refs sync.WaitGroup
	for i := range n {
		refs.Go(func() { ref[i] = play(urls[1], i) })
	}
	refs.Wait()
	for i, r := range ref {
		if r.err != nil || !r.done || r.text == "" {
			t.Fatalf("uninterrupted stream %d: %+v (error: %v)", i, r, r.err)
		}
	}

	f, err := bench.StartFleet(t.Context(), bench.FleetConfig{BackendURLs: urls, Policy: "round-robin", Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]llamaStream, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i] = play(f.URL, i) })
		// One at a time, so that round robin alternates chats and
		// completions between the servers: each server begins both.
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(1000 * time.Millisecond) // under way on both servers
	servers[0].Close()
	wg.Wait()
	same := 0
	cut := map[string]int{} // streams the killed server began, by API
	for i, g := range got {
		if g.err != nil || g.errorEvent || !g.done {
			t.Errorf("stream %d: err %v, error event %v, [DONE] %v", i, g.err, g.errorEvent, g.done)
		}
		if g.backend == f.Names[0] {
			cut[map[bool]string{true: "chat", false: "completion"}[i < chats]]++
		}
		if g.text == ref[i].text {
			same++
		} else {
			t.Logf("stream %d differs from the uninterrupted run:\n got %q\nwant %q", i, g.text, ref[i].text)
		}
	}
	res, err := http.Get(f.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	page, _ := io.ReadAll(res.Body)
	m := regexp.MustCompile(`kvroute_migrations_total\{cause="reset",outcome="continued"\} (\d+)`).FindSubmatch(page)
	if m == nil || string(m[1]) == "0" {
		t.Fatalf("no stream continued on the other llama-server: the test proves nothing")
	}
	if cut["chat"] == 0 || cut["completion"] == 0 {
		t.Errorf("the killed server began %v: want chats and completions", cut)
	}
	t.Logf("%d of %d streams equal the uninterrupted run; the killed server began %v; continued on the other llama-server: %s", same, n, cut, m[1])
}
