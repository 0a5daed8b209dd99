package proxy

import (
	"bufio"
	"github.com/kvroute/kvroute/internal/fleet"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const streamBody = `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`

// okStream answers every request with a one-token stream.
func okStream(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, `data: {"choices":[{"delta":{"content":"ok"}}]}`+"\n\ndata: [DONE]\n\n")
}

// hang holds a request until its client goes away or the test ends. It
// reads the body first: only then does the server notice a client that
// closed the connection.
func hang(done <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-time.After(time.Minute):
		case <-r.Context().Done():
		case <-done:
		}
	}
}

// quick makes the proxy's timeouts short enough for a test.
func quick(cfg *Config) {
	cfg.Resilience = Resilience{FirstTokenFloor: 300 * time.Millisecond, FirstTokenFactor: -1e-9,
		StreamIdleTimeout: 300 * time.Millisecond, ResponseTimeout: 300 * time.Millisecond}
}

// A backend that answers 429, 502, 503 or 504, or that never answers, or
// whose connection drops before it answers, did not take the request:
// another backend does, and the client sees only the success.
func TestRetriesBeforeTheFirstByte(t *testing.T) {
	done := make(chan struct{})
	defer close(done)
	for _, tt := range []struct {
		name    string
		handler http.HandlerFunc
		reason  string
	}{
		{"429", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "7")
			http.Error(w, `{"error":{"message":"busy"}}`, http.StatusTooManyRequests)
		}, "status"},
		{"503", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }, "status"},
		{"502", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) }, "status"},
		{"hang", hang(done), "timeout"},
		{"reset", func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }, "reset"},
		{"headers, then nothing", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			_ = http.NewResponseController(w).Flush()
			hang(done)(w, r)
		}, "timeout"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bad := newServer(t, tt.handler)
			good := newServer(t, http.HandlerFunc(okStream))
			b0, b1 := testBackend(t, 0, "b0", bad.URL, "m"), testBackend(t, 1, "b1", good.URL, "m")
			pol := newFirstPolicy()
			f := newFakeFleet(b0, b1)
			p, px := newTestProxy(t, f, pol, quick)
			res, body := post(t, px.URL, "/v1/chat/completions", streamBody)
			if res.StatusCode != 200 || res.Header.Get(HeaderBackend) != "b1" || !strings.Contains(body, `"ok"`) {
				t.Fatalf("got %d from %s: %q; want 200 from b1", res.StatusCode, res.Header.Get(HeaderBackend), body)
			}
			if got := counterValue(t, p, "kvroute_retries_total", "backend", "b0", "reason", tt.reason); got != 1 {
				t.Errorf("retries = %v, want 1 (%s)", got, tt.reason)
			}
			first, second := pol.outcome(t), pol.outcome(t)
			if first.Decision.Backend != b0 || first.Status/100 == 2 || second.Decision.Backend != b1 || second.Status != 200 {
				t.Errorf("outcomes %+v then %+v, want b0 failed then b1 200", first.Outcome, second.Outcome)
			}
			px.await(t)
			assertIdle(t, b0, b1)
			// The fleet hears of both: the failure counts towards b0's
			// ejection, a 429 keeps it away for its Retry-After.
			want := map[string]fleet.ResultKind{"status": fleet.ResultGatewayError, "reset": fleet.ResultGatewayError, "timeout": fleet.ResultTimeout}[tt.reason]
			if tt.name == "429" {
				want = fleet.ResultOverloaded
				if until := f.backedOff("b0"); time.Until(until) < 5*time.Second {
					t.Errorf("b0 backed off until %v, want its Retry-After of 7 s", until)
				}
			}
			if got := f.reported("b0"); len(got) != 1 || got[0] != want {
				t.Errorf("b0 reported %v, want [%v]", got, want)
			}
			if got := f.reported("b1"); len(got) != 1 || got[0] != fleet.ResultSuccess {
				t.Errorf("b1 reported %v, want [success]", got)
			}
		})
	}
}

// Out of backends to try, the client gets the last backend's own answer
// when it had one, or a gateway error in OpenAI shape.
func TestRetriesGiveUp(t *testing.T) {
	busy := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "3")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"error":{"message":"busy","type":"requests","param":null,"code":"rate_limit_exceeded"}}`)
	}
	s0, s1 := newServer(t, http.HandlerFunc(busy)), newServer(t, http.HandlerFunc(busy))
	b0, b1 := testBackend(t, 0, "b0", s0.URL, "m"), testBackend(t, 1, "b1", s1.URL, "m")
	_, px := newTestProxy(t, newFakeFleet(b0, b1), newFirstPolicy(), quick)
	res, body := post(t, px.URL, "/v1/chat/completions", chatBody)
	if res.StatusCode != 429 || res.Header.Get("Retry-After") != "3" || !strings.Contains(body, `"busy"`) {
		t.Errorf("got %d (Retry-After %q) %s; want b1's own 429", res.StatusCode, res.Header.Get("Retry-After"), body)
	}

	done := make(chan struct{})
	defer close(done)
	h0, h1 := newServer(t, hang(done)), newServer(t, hang(done))
	b0, b1 = testBackend(t, 0, "h0", h0.URL, "m"), testBackend(t, 1, "h1", h1.URL, "m")
	_, px = newTestProxy(t, newFakeFleet(b0, b1), newFirstPolicy(), quick)
	start := time.Now()
	res, body = post(t, px.URL, "/v1/chat/completions", streamBody)
	if _, typ, code := openAIError(t, body); res.StatusCode != 504 || typ != typeServer || code != codeBackendTimeout {
		t.Errorf("got %d %s, want 504 backend_timeout", res.StatusCode, body)
	}
	// Two first-token deadlines, and no more: bounded however long the
	// backends hang.
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v", d)
	}
	assertIdle(t, b0, b1)
}

// When every backend a request can try answers 429, the request is held for
// the Retry-After, once, and tried again: a backend that is full for a
// second does not cost the client its request.
func TestHoldsA429(t *testing.T) {
	busy := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
	}
	var calls atomic.Int32
	s0 := newServer(t, http.HandlerFunc(busy))
	s1 := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			busy(w, r)
			return
		}
		okStream(w, r)
	}))
	b0, b1 := testBackend(t, 0, "b0", s0.URL, "m"), testBackend(t, 1, "b1", s1.URL, "m")
	// The default timeouts, not quick's: with its 300 ms first-token
	// deadline, b1's answer after the hold came too late under load (504
	// after 2 attempts), and no deadline is what this test checks.
	p, px := newTestProxy(t, newFakeFleet(b0, b1), newFirstPolicy(), nil)
	start := time.Now()
	res, body := post(t, px.URL, "/v1/chat/completions", streamBody)
	if res.StatusCode != 200 || res.Header.Get(HeaderBackend) != "b1" {
		t.Fatalf("got %d from %s: %s; want 200 from b1 after the hold", res.StatusCode, res.Header.Get(HeaderBackend), body)
	}
	if d := time.Since(start); d < time.Second {
		t.Errorf("answered after %v: the Retry-After of 1 s was not waited out", d)
	}
	if got := counterValue(t, p, "kvroute_retries_total", "backend", "b1", "reason", "held"); got != 1 {
		t.Errorf("held = %v, want 1", got)
	}
	assertIdle(t, b0, b1)
}

// A stream whose backend stalls after its first token ends, after the
// idle timeout, with an error event and the end marker; so does a stream
// still running when the proxy stops.
func TestStreamEndsWithErrorEvent(t *testing.T) {
	for _, tt := range []struct {
		name, code string
		stop       bool
	}{
		{"stalled", codeBackendTimeout, false},
		{"shutdown", codeUnavailable, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			done := make(chan struct{})
			defer close(done)
			first := make(chan struct{})
			be := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, `data: {"choices":[{"delta":{"content":"Hi"}}]}`+"\n\n")
				_ = http.NewResponseController(w).Flush()
				close(first)
				hang(done)(w, r)
			}))
			b0 := testBackend(t, 0, "b0", be.URL, "m")
			p, px := newTestProxy(t, newFakeFleet(b0), newFirstPolicy(), func(cfg *Config) {
				quick(cfg)
				if tt.stop {
					cfg.Resilience.StreamIdleTimeout = -1
				}
			})
			req, _ := http.NewRequest(http.MethodPost, px.URL+"/v1/chat/completions", strings.NewReader(streamBody))
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			rd := bufio.NewReader(res.Body)
			if ev := event(t, rd); !strings.Contains(ev, `"Hi"`) {
				t.Fatalf("first event %q", ev)
			}
			<-first
			if tt.stop {
				p.Stop()
			}
			ev := event(t, rd)
			if _, _, code := openAIError(t, strings.TrimPrefix(ev, "data: ")); code != tt.code {
				t.Errorf("event %q, want an error with code %s", ev, tt.code)
			}
			if ev := event(t, rd); ev != "data: [DONE]\n\n" {
				t.Errorf("then %q, want the end marker", ev)
			}
			if rest, err := io.ReadAll(rd); err != nil || len(rest) != 0 {
				t.Errorf("then %q, %v: want a clean end", rest, err)
			}
			px.await(t)
			assertIdle(t, b0)
		})
	}
}

// Draining: /readyz says 503 at once, requests are still served.
func TestDrainTurnsReadyzOff(t *testing.T) {
	good := newServer(t, http.HandlerFunc(okStream))
	p, px := newTestProxy(t, newFakeFleet(testBackend(t, 0, "b0", good.URL, "m")), newFirstPolicy(), nil)
	if res, _ := get(t, px.URL, "/readyz", ""); res.StatusCode != 200 {
		t.Fatalf("readyz %d before draining", res.StatusCode)
	}
	p.Drain()
	if res, body := get(t, px.URL, "/readyz", ""); res.StatusCode != 503 || !strings.Contains(body, "draining") {
		t.Errorf("readyz %d %s while draining, want 503", res.StatusCode, body)
	}
	if res, _ := post(t, px.URL, "/v1/chat/completions", streamBody); res.StatusCode != 200 {
		t.Errorf("a request while draining got %d, want 200", res.StatusCode)
	}
}

// A body that trickles in is cut at the body read timeout with a 408.
func TestSlowBodyTimesOut(t *testing.T) {
	good := newServer(t, http.HandlerFunc(okStream))
	_, px := newTestProxy(t, newFakeFleet(testBackend(t, 0, "b0", good.URL, "m")), newFirstPolicy(), func(cfg *Config) {
		cfg.Resilience.BodyReadTimeout = 200 * time.Millisecond
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(px.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	if _, _, code := openAIError(t, string(body)); res.StatusCode != http.StatusRequestTimeout || code != codeRequestTimeout {
		t.Errorf("got %d %s, want 408 request_timeout", res.StatusCode, body)
	}
}

// When every candidate has its fill of requests, the next waits in the
// router's queue and runs when one ends; past the queue, requests are
// refused at once with 429 and a Retry-After.
func TestOverloadQueuesThenRefuses(t *testing.T) {
	hold := make(chan struct{})
	arrived := make(chan struct{}, 10)
	be := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-hold
		okStream(w, r)
	}))
	b0 := testBackend(t, 0, "b0", be.URL, "m")
	_, px := newTestProxy(t, newFakeFleet(b0), newFirstPolicy(), func(cfg *Config) {
		cfg.Overload.MaxPerBackend = 1
		cfg.Overload.Admission.MaxQueue = 1
	})
	type answer struct {
		status int
		body   string
		retry  string
	}
	send := func() chan answer {
		c := make(chan answer, 1)
		go func() {
			res, body := post(t, px.URL, "/v1/chat/completions", streamBody)
			c <- answer{res.StatusCode, body, res.Header.Get("Retry-After")}
		}()
		return c
	}
	first := send()
	<-arrived
	second := send() // queued: b0 is full
	waitFor(t, func() bool {
		return strings.Contains(metricsText(t, px.URL), `kvroute_admission_queue_length{class="standard"} 1`)
	})
	third := <-send() // the queue is full too
	if _, _, code := openAIError(t, third.body); third.status != 429 || third.retry == "" || code != "queue_full" {
		t.Errorf("third: %d (Retry-After %q) %s, want 429 queue_full with a Retry-After", third.status, third.retry, third.body)
	}
	close(hold)
	for i, c := range []chan answer{first, second} {
		if a := <-c; a.status != 200 {
			t.Errorf("request %d: %d %s", i+1, a.status, a.body)
		}
	}
	assertIdle(t, b0)
}

// A request whose deadline the best backend is predicted to miss is
// refused at once, before any prefill is spent on it.
func TestDeadlineUnmeetable(t *testing.T) {
	arrived := make(chan struct{}, 10)
	be := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		okStream(w, r)
	}))
	b0 := testBackend(t, 0, "b0", be.URL, "m")
	pol := newFirstPolicy()
	pol.predict = 5 * time.Second
	_, px := newTestProxy(t, newFakeFleet(b0), pol, nil)
	res, body := post(t, px.URL, "/v1/chat/completions", streamBody, HeaderDeadline, "1s")
	if _, _, code := openAIError(t, body); res.StatusCode != 429 || code != "deadline_unmeetable" {
		t.Errorf("got %d %s, want 429 deadline_unmeetable", res.StatusCode, body)
	}
	if len(arrived) != 0 {
		t.Error("the backend got a request that could not meet its deadline")
	}
	if res, body := post(t, px.URL, "/v1/chat/completions", streamBody, HeaderDeadline, "10s"); res.StatusCode != 200 {
		t.Errorf("with a deadline of 10 s: %d %s", res.StatusCode, body)
	}
	assertIdle(t, b0)
}

// waitFor polls cond until it holds, for at most 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10 s")
		}
	}
}

// metricsText is the proxy's /metrics page.
func metricsText(t *testing.T, url string) string {
	t.Helper()
	_, body := get(t, url, "/metrics", "")
	return body
}

func TestRetryBudget(t *testing.T) {
	now := time.Unix(1000, 0)
	b := retryBudget{ratio: 0.2, min: 3, now: func() time.Time { return now }}
	for range 3 {
		if !b.acquire() {
			t.Fatal("the minimum of 3 retries was refused")
		}
	}
	if b.allows() || b.acquire() {
		t.Error("a 4th retry with nothing in flight")
	}
	for range 50 {
		b.start() // 20 % of 50: 10 retries
	}
	for range 7 {
		if !b.acquire() {
			t.Fatal("a retry within 20 % of 50 was refused")
		}
	}
	if b.acquire() {
		t.Error("an 11th retry with 50 in flight")
	}
	// 40 of the 50 end at once: for a while the budget still counts them.
	b.active.Add(-40)
	if b.limit() != 10 {
		t.Errorf("limit %d just after a burst of 50, want 10", b.limit())
	}
	now = now.Add(budgetMemory + time.Second)
	if b.limit() != 3 {
		t.Errorf("limit %d long after the burst, with 10 in flight, want the minimum 3", b.limit())
	}
}

// The idle watch counts from the latest read: a stream that keeps reading
// outlives its idle timeout many times over, and one that stops is cut
// once it has been quiet for the timeout.
//
// The reads come every 25 ms only as a loaded machine lets this goroutine
// run: a stall of the idle timeout between two of them is a real quiet
// spell, and a cut in it is right. So a cut fails the test only when every
// gap between reads, as the watchdog itself recorded them, was shorter than
// the timeout; after a stall the reading starts again.
func TestWatchdogIdleCountsFromLatestRead(t *testing.T) {
	const idle = 500 * time.Millisecond
	for attempt := 1; ; attempt++ {
		stalled, quiet := watchReads(t, idle)
		if !stalled {
			if time.Since(quiet) < idle {
				t.Errorf("cut %v after the latest read; want errIdleTimeout after %v", time.Since(quiet), idle)
			}
			return
		}
		if attempt == 10 {
			t.Fatalf("%d attempts, and in each a gap between reads as long as the idle timeout: the machine is too loaded to tell", attempt)
		}
		t.Logf("attempt %d: a gap between reads as long as the idle timeout; reading again", attempt)
	}
}

// watchReads reads (touches a watchdog with the idle timeout idle) every
// idle/20 for 4 idle, then stops and waits for the cut. It fails t on a
// cut while no gap between reads reached idle; stalled reports a gap that
// did (then nothing was checked), quiet the time of the latest read.
func watchReads(t *testing.T, idle time.Duration) (stalled bool, quiet time.Time) {
	t.Helper()
	cut := make(chan error, 1)
	w := newWatchdog(func(err error) { cut <- err })
	defer w.stop()
	w.firstToken(time.Hour)
	w.idle(idle)
	prev, longest := time.Duration(w.last.Load()), time.Duration(0)
	for end := time.Now().Add(4 * idle); time.Now().Before(end); time.Sleep(idle / 20) {
		quiet = time.Now()
		w.touch()
		last := time.Duration(w.last.Load())
		longest, prev = max(longest, last-prev), last
		if longest >= idle {
			return true, quiet
		}
		select {
		case err := <-cut:
			t.Fatalf("cut (%v) while reading, the longest gap between reads %v", err, longest)
		default:
		}
	}
	select {
	case err := <-cut:
		if err != errIdleTimeout {
			t.Fatalf("cut with %v, want errIdleTimeout", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("not cut a minute after the latest read")
	}
	return false, quiet
}
