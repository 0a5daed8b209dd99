//go:build unix

package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/testfleet"
)

// chatReply is one streamed chat answer as its client saw it.
type chatReply struct {
	status       int
	text         string
	ids          map[string]bool // the chunks' ids
	finish       string
	prompt, done int  // usage: prompt and completion tokens
	completed    bool // [DONE] came
	errorEvent   bool
	backend      string
	maxGap       time.Duration // the longest wait between two content chunks
	err          error
}

// streamChat sends one streamed chat request, with usage, to url and reads
// it to its end.
func streamChat(url, text string, maxTokens int) chatReply {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`,
		model, text, maxTokens)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return chatReply{err: err}
	}
	defer res.Body.Close()
	r := chatReply{status: res.StatusCode, ids: map[string]bool{}, backend: res.Header.Get(proxy.HeaderBackend)}
	var b strings.Builder
	var last time.Time
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			r.completed = true
			continue
		}
		var c struct {
			ID      string `json:"id"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				Prompt     int `json:"prompt_tokens"`
				Completion int `json:"completion_tokens"`
			} `json:"usage"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			r.err = err
			return r
		}
		if c.Error != nil {
			r.errorEvent = true
			continue
		}
		r.ids[c.ID] = true
		for _, ch := range c.Choices {
			if ch.Delta.Content != "" {
				now := time.Now()
				if !last.IsZero() {
					r.maxGap = max(r.maxGap, now.Sub(last))
				}
				last = now
				b.WriteString(ch.Delta.Content)
			}
			if ch.FinishReason != nil {
				r.finish = *ch.FinishReason
			}
		}
		if c.Usage != nil {
			r.prompt, r.done = c.Usage.Prompt, c.Usage.Completion
		}
	}
	r.err = sc.Err()
	r.text = b.String()
	return r
}

// checkContinued checks that every stream completed as the uninterrupted
// one from a healthy backend (ref) did: the same text, one id, the same
// finish reason and usage, no error event. It returns the streams served
// first by the backend named cut.
func checkContinued(t *testing.T, got, ref []chatReply, cut string) (migrated []chatReply) {
	t.Helper()
	for i, r := range got {
		w := ref[i]
		switch {
		case r.err != nil || r.status != http.StatusOK:
			t.Errorf("stream %d: status %d, err %v", i, r.status, r.err)
		case r.errorEvent || !r.completed:
			t.Errorf("stream %d ended with an error event (%v) or without [DONE] (%v)", i, r.errorEvent, r.completed)
		case r.text != w.text:
			t.Errorf("stream %d: text\n%q\nwant the uninterrupted\n%q", i, r.text, w.text)
		case len(r.ids) != 1 || r.finish != w.finish || r.prompt != w.prompt || r.done != w.done:
			t.Errorf("stream %d: ids %v, finish %q, usage %d+%d; want one id, %q, %d+%d", i, r.ids, r.finish, r.prompt, r.done,
				w.finish, w.prompt, w.done)
		}
		if r.backend == cut {
			migrated = append(migrated, r)
		}
	}
	return migrated
}

// manyChats streams n chat requests at once to url; after, if not nil, runs
// while they are under way.
func manyChats(url string, n, maxTokens int, after func()) []chatReply {
	out := make([]chatReply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i] = streamChat(url, fmt.Sprintf("request %d: tell me a story", i), maxTokens) })
	}
	if after != nil {
		after()
	}
	wg.Wait()
	return out
}

// references are the uninterrupted answers to manyChats' requests, from
// the emulator at url.
func references(url string, n, maxTokens int) []chatReply { return manyChats(url, n, maxTokens, nil) }

// gaps logs the router's migrations and the cut-to-continuation gaps of
// the streams first served by the failed backend.
func gaps(t *testing.T, s *Server, what string, migrated []chatReply) {
	t.Helper()
	res, err := http.Get(s.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var counts []string
	for _, m := range regexp.MustCompile(`(?m)^kvroute_migrations_total\{cause="(\w+)",outcome="(\w+)"\} (\d+)$`).FindAllSubmatch(page, -1) {
		if string(m[3]) != "0" {
			counts = append(counts, fmt.Sprintf("%s/%s %s", m[1], m[2], m[3]))
		}
	}
	t.Logf("%s: migrations (cause/outcome count): %v", what, counts)
	if len(migrated) == 0 {
		return
	}
	var d []time.Duration
	for _, r := range migrated {
		d = append(d, r.maxGap)
	}
	slices.Sort(d)
	t.Logf("%s: %d streams first served by the failed backend; their longest gap between two chunks: p50 %v, p99 %v, max %v", what, len(d),
		d[len(d)/2].Round(time.Millisecond), d[(len(d)*99)/100].Round(time.Millisecond), d[len(d)-1].Round(time.Millisecond))
}

// A backend that cuts every stream after 8 tokens: every stream completes,
// its text that of an uninterrupted run, and the backend is ejected.
func TestMigrateDieAfterTokens(t *testing.T) {
	emus := testfleet.Start(t, 3, "--seed", "7")
	emus[0].SetFaults(emulator.Faults{DieAfterTokens: 8})
	s := startRouter(t, emus, roundRobin)
	got := manyChats(s.URL, 30, 40, nil)
	ref := references(emus[1].URL(), 30, 40)
	migrated := checkContinued(t, got, ref, "gpu0")
	if len(migrated) == 0 {
		t.Error("no stream went to the cutting backend first: the test proves nothing")
	}
	gaps(t, s, "cut after 8 tokens", migrated)
	if !s.Fleet.Ejected(s.Fleet.Backends()[0]) {
		t.Error("the backend that cuts every stream is not ejected")
	}
}

// SIGKILL of one of three backends under 200 streams: none ends in an
// error, every one's text is the uninterrupted run's.
func TestMigrateKill(t *testing.T) {
	emus := testfleet.Start(t, 3, "--seed", "8")
	s := startRouter(t, emus, func(c *Config) { c.Proxy.Resilience.FirstTokenFloor = patience })
	got := manyChats(s.URL, 200, 300, func() {
		waitFor(t, func() bool { return inflight(s, 0) > 5 })
		time.Sleep(500 * time.Millisecond) // under way: past their first tokens
		emus[0].Kill()
	})
	ref := references(emus[1].URL(), 200, 300)
	migrated := checkContinued(t, got, ref, "gpu0")
	if len(migrated) == 0 {
		t.Error("no stream was on the killed backend: the test proves nothing")
	}
	gaps(t, s, "SIGKILL", migrated)
}

// A SIGSTOPped backend under 30 streams: after the idle timeout each of its
// streams continues elsewhere, none ends in an error, every one's text is
// the uninterrupted run's.
func TestMigrateStop(t *testing.T) {
	emus := testfleet.Start(t, 3, "--seed", "9")
	s := startRouter(t, emus)
	got := manyChats(s.URL, 30, 400, func() {
		waitFor(t, func() bool { return inflight(s, 0) > 3 })
		time.Sleep(300 * time.Millisecond) // under way: past the first token
		emus[0].Stop()
	})
	defer emus[0].Cont()
	ref := references(emus[1].URL(), 30, 400)
	migrated := checkContinued(t, got, ref, "gpu0")
	if len(migrated) == 0 {
		t.Error("no stream was on the stopped backend: the test proves nothing")
	}
	for i, r := range migrated {
		if r.maxGap < idleTimeout {
			t.Errorf("migrated stream %d continued %v after its last chunk, before the idle timeout", i, r.maxGap)
		}
	}
	gaps(t, s, "SIGSTOP (idle timeout "+idleTimeout.String()+")", migrated)
}

// streamCompletion streams one completion of prompt from url and returns
// its text, or an error naming what went wrong.
func streamCompletion(url, prompt string, maxTokens int) (string, error) {
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":%d,"stream":true}`, model, prompt, maxTokens)
	res, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	var b strings.Builder
	done := false
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		switch {
		case !ok:
			continue
		case data == "[DONE]":
			done = true
			continue
		case strings.HasPrefix(data, `{"error"`):
			return "", fmt.Errorf("error event %s", data)
		}
		var c struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return "", err
		}
		for _, ch := range c.Choices {
			b.WriteString(ch.Text)
		}
	}
	if !done {
		return "", fmt.Errorf("no [DONE] (status %d, err %v)", res.StatusCode, sc.Err())
	}
	return b.String(), nil
}

// A completion cut after 8 tokens continues as the prompt and its text so
// far, and ends as the uninterrupted one.
func TestMigrateCompletion(t *testing.T) {
	emus := testfleet.Start(t, 2, "--seed", "10")
	emus[0].SetFaults(emulator.Faults{DieAfterTokens: 8})
	s := startRouter(t, emus, roundRobin)
	for i := range 4 {
		prompt := fmt.Sprintf("Story %d.\n", i)
		got, err := streamCompletion(s.URL, prompt, 30)
		want, werr := streamCompletion(emus[1].URL(), prompt, 30)
		if err != nil || werr != nil || got != want {
			t.Errorf("completion %d: %q (%v), want the uninterrupted %q (%v)", i, got, err, want, werr)
		}
	}
	if faultsServed(t, emus[0], "die") == 0 {
		t.Error("no completion was cut: the test proves nothing")
	}
}

// A backend drained with SIGTERM ends the streams still running past its
// grace with an error event: each continues elsewhere, as the
// uninterrupted run.
func TestMigrateTerm(t *testing.T) {
	emus := testfleet.Start(t, 3, "--seed", "11", "--time-scale", "0.5")
	s := startRouter(t, emus)
	// The backend drained is the one serving most of the streams, wherever
	// the policy put them.
	drained := -1
	got := manyChats(s.URL, 9, 3000, func() {
		waitFor(t, func() bool { return inflight(s, 0)+inflight(s, 1)+inflight(s, 2) == 9 })
		time.Sleep(300 * time.Millisecond) // under way: past the first token
		drained = 0
		for i := range emus {
			if inflight(s, i) > inflight(s, drained) {
				drained = i
			}
		}
		emus[drained].Term()
	})
	ref := references(emus[(drained+1)%len(emus)].URL(), 9, 3000)
	migrated := checkContinued(t, got, ref, fmt.Sprintf("gpu%d", drained))
	if len(migrated) == 0 {
		t.Error("no stream was on the drained backend: the test proves nothing")
	}
	gaps(t, s, "SIGTERM past the backend's grace", migrated)
}

// A stream cut after its last allowed token, before its finish, ends as
// the uninterrupted one would, with finish_reason "length" (and no usage:
// the backend's never came).
func TestMigrateSpent(t *testing.T) {
	emus := testfleet.Start(t, 2, "--seed", "12")
	emus[0].SetFaults(emulator.Faults{DieAfterTokens: 8})
	s := startRouter(t, emus, roundRobin)
	for i := range 4 {
		text := fmt.Sprintf("request %d: tell me a story", i)
		got, want := streamChat(s.URL, text, 8), streamChat(emus[1].URL(), text, 8)
		if got.err != nil || got.errorEvent || !got.completed || got.text != want.text || got.finish != "length" || len(got.ids) != 1 {
			t.Errorf("stream %d: %+v, want the uninterrupted %q ending with length", i, got, want.text)
		}
	}
	if faultsServed(t, emus[0], "die") == 0 {
		t.Error("no stream was cut: the test proves nothing")
	}
}

// roundRobin routes with round-robin: a test that faults one backend needs
// requests to reach it, which a cache-aware policy need not send there.
func roundRobin(c *Config) { c.Policy = "round-robin" }
