package epp

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router/policies"
	"github.com/kvroute/kvroute/internal/server"
	"github.com/kvroute/kvroute/internal/workload"
)

func model(bs []*fleet.Backend) string { return bs[0].Info().Models[0] }

func TestRoutesThroughEnvoyProtocol(t *testing.T) {
	ctx := t.Context()
	bs := emulators(t, ctx, 3)
	for _, policy := range []string{"kvroute", "round-robin"} {
		t.Run(policy, func(t *testing.T) {
			_, env := startPicker(t, ctx, bs, policy, Options{Fallbacks: 2})
			env.chunks = 5
			for i := range 6 {
				body := chatBody(model(bs), []message{{"user", fmt.Sprintf("question %d: %s", i, strings.Repeat("why is the sky blue? ", 40))}}, 8)
				res, err := env.do(ctx, "/v1/chat/completions", map[string]string{"x-session-id": fmt.Sprint(i)}, body)
				if err != nil {
					t.Fatal(err)
				}
				if res.status != http.StatusOK || res.immediate {
					t.Fatalf("status %d (immediate %v): %s", res.status, res.immediate, res.body)
				}
				if len(res.list) != 3 {
					t.Errorf("destination list %q, want the chosen endpoint and 2 fallbacks", res.list)
				}
				if res.dest != strings.Join(res.list, ",") {
					t.Errorf("header %q, want the metadata's list %q", res.dest, res.list)
				}
				if text, prompt, _ := reply(res.body); text == "" || prompt <= 0 {
					t.Errorf("reply %q with %d prompt tokens: want text and usage", text, prompt)
				}
			}
			for _, b := range bs {
				if l := b.Load(); l.Requests != 0 {
					t.Errorf("%s: %d requests still counted in flight", b.Name, l.Requests)
				}
			}
		})
	}
}

func TestImmediateResponses(t *testing.T) {
	ctx := t.Context()
	bs := emulators(t, ctx, 1)
	_, env := startPicker(t, ctx, bs, "kvroute", Options{MaxPerEndpoint: 1, Admission: admissionNoQueue()})
	tests := []struct {
		name       string
		body       []byte
		hold       bool // another request is in flight on the one endpoint
		wantStatus int
		wantRetry  bool
	}{
		{"unknown model", chatBody("no-such-model", []message{{"user", "hi"}}, 4), false, http.StatusServiceUnavailable, true},
		{"malformed body", []byte(`{"model":`), false, http.StatusBadRequest, false},
		{"endpoint full", chatBody(model(bs), []message{{"user", "hi"}}, 4), true, http.StatusTooManyRequests, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.hold {
				stop := holdRequest(t, env, model(bs))
				defer stop()
			}
			res, err := env.do(ctx, "/v1/chat/completions", nil, tt.body)
			if err != nil {
				t.Fatal(err)
			}
			if !res.immediate || res.status != tt.wantStatus {
				t.Fatalf("status %d (immediate %v), want an immediate %d", res.status, res.immediate, tt.wantStatus)
			}
			if (res.retryAfter != "") != tt.wantRetry {
				t.Errorf("Retry-After %q, want one: %v", res.retryAfter, tt.wantRetry)
			}
			if !bytes.HasPrefix(res.body, []byte(`{"error":{"message":`)) {
				t.Errorf("body %s is not an OpenAI error", res.body)
			}
		})
	}
	// Once the held request's stream is gone, the endpoint takes requests
	// again: its ticket was finished (the picker notices the cut stream on
	// its own goroutine: wait for the load to be released).
	for deadline := time.Now().Add(10 * time.Second); bs[0].Load().Requests != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("load %+v left after the held stream was cut", bs[0].Load())
		}
	}
	res, err := env.do(ctx, "/v1/chat/completions", nil, chatBody(model(bs), []message{{"user", "hi"}}, 4))
	if err != nil || res.status != http.StatusOK {
		t.Fatalf("after the refusals: status %d, %v", res.status, err)
	}
}

// holdRequest routes a request and leaves it in flight (Envoy waiting for
// the upstream's answer) until stop, which cuts the stream, as Envoy does
// when the client goes away.
func holdRequest(t *testing.T, env *envoy, model string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	st, err := env.ext.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	body := chatBody(model, []message{{"user", "hold"}}, 4)
	_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{hv(":method", "POST"), hv(":path", "/v1/chat/completions")}}}}})
	_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}})
	if m, err := st.Recv(); err != nil || m.GetRequestHeaders() == nil {
		t.Fatalf("held request: %v, %v", m, err)
	}
	return cancel
}

func TestCutStreamReleasesLoad(t *testing.T) {
	ctx := t.Context()
	bs := emulators(t, ctx, 1)
	_, env := startPicker(t, ctx, bs, "kvroute", Options{})
	stop := holdRequest(t, env, model(bs))
	if n := bs[0].Load().Requests; n != 1 {
		t.Fatalf("%d requests in flight while held, want 1", n)
	}
	stop()
	deadline := time.Now().Add(5 * time.Second)
	for bs[0].Load().Requests != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the cut stream's request is still counted in flight")
		}
		time.Sleep(5 * time.Millisecond) // the server learns of the cut asynchronously
	}
}

// TestCacheHitRateMatchesServe plays the same multi-turn chat through the
// picker and through `serve`, each in front of a fresh identical fleet, and
// compares the prompt-cache hit rates the emulators report.
func TestCacheHitRateMatchesServe(t *testing.T) {
	if testing.Short() {
		t.Skip("plays 80 requests twice")
	}
	ctx := t.Context()
	cfg := workload.SmallChat()
	cfg.Sessions, cfg.Turns = 20, 4
	sessions := workload.Chat(cfg, 7)

	bsEPP := emulators(t, ctx, 4)
	_, env := startPicker(t, ctx, bsEPP, "kvroute", Options{Fallbacks: 2, IncludeUsage: true})
	env.chunks = 3
	eppRate := converse(t, sessions, model(bsEPP), func(id string, body []byte) ([]byte, error) {
		res, err := env.do(ctx, "/v1/chat/completions", map[string]string{"x-session-id": id}, body)
		if err == nil && res.status != http.StatusOK {
			err = fmt.Errorf("status %d: %s", res.status, res.body)
		}
		return res.body, err
	})

	bsServe := emulators(t, ctx, 4)
	s, err := server.Start(ctx, server.Config{Backends: bsServe, Policy: "kvroute", Listen: "127.0.0.1:0",
		DrainDelay: -1, Logger: quiet(), Router: policies.Options{Seed: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	client := &http.Client{}
	serveRate := converse(t, sessions, model(bsServe), func(id string, body []byte) ([]byte, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Session-ID", id)
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
		}
		return b, err
	})
	// For scale: what a cache-blind policy gets through the picker.
	bsRR := emulators(t, ctx, 4)
	_, envRR := startPicker(t, ctx, bsRR, "round-robin", Options{})
	rrRate := converse(t, sessions, model(bsRR), func(id string, body []byte) ([]byte, error) {
		res, err := envRR.do(ctx, "/v1/chat/completions", map[string]string{"x-session-id": id}, body)
		return res.body, err
	})
	t.Logf("prompt-cache hit rate: epp %.1f%%, serve %.1f%% (round-robin through the epp: %.1f%%)", 100*eppRate, 100*serveRate, 100*rrRate)
	if d := eppRate - serveRate; d < -0.02 || d > 0.02 {
		t.Errorf("hit rate through the picker %.1f%%, through serve %.1f%%: more than 2 points apart", 100*eppRate, 100*serveRate)
	}
}

// converse plays sessions, each turn after the reply to the one before and
// carrying the whole conversation, and returns the share of prompt tokens
// the backends reported cached. A session starts once the one before has
// its first reply, so that where conversations begin does not depend on
// which goroutine runs first; then they go on side by side.
func converse(t *testing.T, sessions []workload.Session, model string, send func(id string, body []byte) ([]byte, error)) float64 {
	t.Helper()
	var (
		mu             sync.Mutex
		prompt, cached int
		wg             sync.WaitGroup
	)
	next := make(chan struct{})
	for _, s := range sessions {
		wg.Go(func() {
			var once sync.Once
			started := func() { once.Do(func() { next <- struct{}{} }) }
			defer started() // a session that fails early still lets the next begin
			msgs := []message{{"system", s.System}}
			for i, turn := range s.Turns {
				if i == 1 {
					started()
				}
				msgs = append(msgs, message{turn.MessageRole(), turn.Text()})
				body, err := send(s.ID, chatBody(model, msgs, turn.MaxTokens))
				if err != nil {
					t.Errorf("%s: %v", s.ID, err)
					return
				}
				text, p, c := reply(body)
				msgs = append(msgs, message{"assistant", text})
				mu.Lock()
				prompt, cached = prompt+max(p, 0), cached+max(c, 0)
				mu.Unlock()
			}
		})
		<-next
	}
	wg.Wait()
	if prompt == 0 {
		t.Fatal("no prompt tokens reported")
	}
	return float64(cached) / float64(prompt)
}

func admissionNoQueue() admission.Config { return admission.Config{MaxQueue: -1} }
