package follow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/router"
)

func TestParseEndpoint(t *testing.T) {
	tests := []struct {
		in      string
		want    kvevents.Source
		wantErr bool
	}{
		{in: "gpu0=tcp://10.0.0.5:5557", want: kvevents.Source{Name: "gpu0", Endpoint: "tcp://10.0.0.5:5557"}},
		{in: "gpu0=tcp://h:5557,tcp://h:5558", want: kvevents.Source{Name: "gpu0", Endpoint: "tcp://h:5557", Replay: "tcp://h:5558"}},
		{in: "tcp://h:5557", wantErr: true},
		{in: "gpu0=", wantErr: true},
		{in: "gpu0=http://h:5557", wantErr: true},
		{in: "gpu0=tcp://h:1,ipc:///x", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			name, src, err := ParseEndpoint(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseEndpoint(%q) error %v, want error %v", tt.in, err, tt.wantErr)
			}
			if err == nil && (src != tt.want || name != tt.want.Name) {
				t.Fatalf("ParseEndpoint(%q) = %q, %+v; want %+v", tt.in, name, src, tt.want)
			}
		})
	}
}

// tokenizeServer answers /tokenize with one id per byte of the prompt or
// of the messages' JSON, and counts its calls.
func tokenizeServer(t *testing.T, calls *atomic.Int64) *fleet.Backend {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path != "/tokenize" || r.Header.Get("Authorization") != "Bearer k" {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		var req struct {
			Messages            json.RawMessage `json:"messages"`
			Prompt              string          `json:"prompt"`
			AddGenerationPrompt bool            `json:"add_generation_prompt"`
		}
		data, _ := io.ReadAll(r.Body)
		if json.Unmarshal(data, &req) != nil {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		text := req.Prompt + string(req.Messages)
		toks := make([]int32, len(text))
		for i := range text {
			toks[i] = int32(text[i])
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"count": len(toks), "max_model_len": 1000, "tokens": toks})
	}))
	t.Cleanup(ts.Close)
	b, err := fleet.ParseBackend(0, "b0="+ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	b.APIKey = "k"
	return b
}

func TestTokenizer(t *testing.T) {
	var calls atomic.Int64
	b := tokenizeServer(t, &calls)
	tok := NewTokenizer(nil, time.Second, 2)
	chat := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`)
	for range 3 {
		toks, err := tok.Tokens(context.Background(), b, chat)
		if err != nil {
			t.Fatal(err)
		}
		if want := len(`[{"role":"user","content":"hi"}]`); len(toks) != want {
			t.Fatalf("%d tokens, want %d", len(toks), want)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d /tokenize calls for one prompt, want 1 (cached)", n)
	}
	// Other bodies: a completion, then more than the cache holds.
	for i := range 3 {
		if _, err := tok.Tokens(context.Background(), b, fmt.Appendf(nil, `{"prompt":"p%d"}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tok.Tokens(context.Background(), b, chat); err != nil || calls.Load() != 5 {
		t.Fatalf("after eviction: %v, %d calls; want the chat asked again (5)", err, calls.Load())
	}
	if _, err := tok.Tokens(context.Background(), b, []byte(`{"input":"a responses request"}`)); !errors.Is(err, ErrNoPrompt) {
		t.Fatalf("a body without messages or prompt: %v, want ErrNoPrompt", err)
	}
	b.APIKey = "wrong"
	if _, err := tok.Tokens(context.Background(), b, []byte(`{"prompt":"new"}`)); err == nil {
		t.Fatal("a 404 from /tokenize should be an error")
	}
}

// TestFollowerFleet follows a backend publishing on 127.0.0.1, matches a
// prompt against its events, and forgets it when it leaves the fleet.
func TestFollowerFleet(t *testing.T) {
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var calls atomic.Int64
	b := tokenizeServer(t, &calls)
	other, _ := fleet.ParseBackend(1, "b1=http://127.0.0.1:1")
	f := NewFollower(FollowConfig{Endpoints: map[string]kvevents.Source{
		"b0": {Endpoint: "tcp://" + pub.Addr().String(), Replay: "tcp://" + pub.ReplayAddr().String()},
	}, Retry: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); f.Wait() }()
	f.Start(ctx, []*fleet.Backend{b, other})

	body := []byte(`{"prompt":"abcdefghij"}`)
	toks := []int32{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j'}
	if _, err := pub.Publish(kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: []uint64{7, 8}, Tokens: toks[:8], BlockSize: 4, Medium: kvevents.MediumGPU}}}); err != nil {
		t.Fatal(err)
	}
	dst := make([]router.KVState, 2)
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.Match(&router.Request{Body: body}, []*fleet.Backend{b, other}, dst)
		if dst[0].Exact {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no exact state: %+v", dst)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if want := (router.KVState{Tokens: 8, Known: true, Exact: true}); dst[0] != want || dst[1] != (router.KVState{}) {
		t.Fatalf("Match = %+v; want %+v and nothing known of b1", dst, want)
	}
	f.SetBackends([]*fleet.Backend{other})
	deadline = time.Now().Add(10 * time.Second)
	for st, _ := f.Store().Status(0); st != kvevents.Unknown; st, _ = f.Store().Status(0) {
		if time.Now().After(deadline) {
			t.Fatal("a removed backend's state is kept")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestResolveTopics: an engine that connects names itself in its topic as
// llm-d's do, kv@HOST:PORT@MODEL (its serving port), or kv@HOST@MODEL;
// either finds its backend, unless the name fits several.
func TestResolveTopics(t *testing.T) {
	var bs []*fleet.Backend
	for i, spec := range []string{"a=http://127.0.0.1:18101", "b=http://127.0.0.1:18102", "c=http://10.0.0.5:8000", "d=https://vllm.example"} {
		b, err := fleet.ParseBackend(i, spec)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	f := NewFollower(FollowConfig{ReplayPort: 5558})
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); f.Wait() }()
	f.Start(ctx, bs)
	for topic, want := range map[string]string{
		"kv@127.0.0.1:18101@m":  "a tcp://127.0.0.1:5558",
		"kv@127.0.0.1:18102@m":  "b tcp://127.0.0.1:5558",
		"kv@127.0.0.1@m":        "", // two engines on the host
		"kv@10.0.0.5@m":         "c tcp://10.0.0.5:5558",
		"kv@10.0.0.5:8000@m":    "c tcp://10.0.0.5:5558",
		"kv@10.0.0.5:9000@m":    "",
		"kv@vllm.example:443@m": "d tcp://vllm.example:5558",
		"kv@10.0.0.9:8000@m":    "",
		"kv":                    "",
	} {
		src, ok := f.resolve(topic)
		got := ""
		if ok {
			got = src.Name + " " + src.Replay
		}
		if got != want {
			t.Errorf("resolve(%q) = %q, want %q", topic, got, want)
		}
	}
}
