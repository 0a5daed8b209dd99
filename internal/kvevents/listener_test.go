package kvevents

import (
	"context"
	"testing"
	"time"
)

func TestReplayFrames(t *testing.T) {
	seq5 := []byte{0, 0, 0, 0, 0, 0, 0, 5}
	end := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	tests := []struct {
		name    string
		frames  [][]byte
		seq     int64
		payload string
		wantErr bool
	}{
		{name: "vLLM", frames: [][]byte{{}, seq5, []byte("p")}, seq: 5, payload: "p"},
		{name: "vLLM end", frames: [][]byte{{}, end, {}}, seq: -1},
		{name: "llm-d, with its topic", frames: [][]byte{{}, []byte("kv@h@m"), seq5, []byte("p")}, seq: 5, payload: "p"},
		{name: "llm-d end", frames: [][]byte{{}, {}, end, {}}, seq: -1},
		{name: "short sequence number", frames: [][]byte{{}, {1}, []byte("p")}, wantErr: true},
		{name: "one frame", frames: [][]byte{{}, seq5}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seq, payload, err := replayFrames(tt.frames)
			if (err != nil) != tt.wantErr || (err == nil && (seq != tt.seq || string(payload) != tt.payload)) {
				t.Fatalf("replayFrames = %d, %q, %v; want %d, %q, error %v", seq, payload, err, tt.seq, tt.payload, tt.wantErr)
			}
		})
	}
}

func TestTopicHost(t *testing.T) {
	for topic, want := range map[string]string{"kv@10.0.0.5@Qwen/Qwen2.5": "10.0.0.5", "kv@h@m@x": "h", "kv": "", "kv@@m": "", "": ""} {
		host, ok := TopicHost(topic)
		if host != want || ok != (want != "") {
			t.Errorf("TopicHost(%q) = %q, %v; want %q", topic, host, ok, want)
		}
	}
}

// TestListenerOverZMQ binds a listener that two engines connect to, as
// llm-d's simulators do, each naming itself in its topic: each engine's
// batches reach its own backend's state, an unknown engine's are dropped,
// and a batch lost before a lull is recovered from the engine's replay
// socket.
func TestListenerOverZMQ(t *testing.T) {
	store := NewStore(KeyTokens)
	ctx, cancel := context.WithCancel(context.Background())
	var replayA string // engine a's replay socket, bound below
	resolve := func(topic string) (Source, bool) {
		host, ok := TopicHost(topic)
		idx := map[string]int{"a": 0, "b": 1}[host]
		if !ok || (host != "a" && host != "b") {
			return Source{}, false
		}
		src := Source{Backend: idx, Name: host, Topic: topic}
		if host == "a" {
			src.Replay = replayA
		}
		return src, true
	}
	l, err := Listen(ctx, "tcp://127.0.0.1:0", resolve, store, SubscriberOptions{Probe: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	pubs := map[string]*Publisher{}
	for _, host := range []string{"a", "b", "stranger"} {
		cfg := PublisherConfig{Endpoint: "tcp://" + l.Addr().String(), Connect: true, Topic: "kv@" + host + "@m"}
		if host == "a" {
			cfg.Replay = "tcp://127.0.0.1:0"
		}
		p, err := NewPublisher(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		pubs[host] = p
		if host == "a" {
			replayA = "tcp://" + p.ReplayAddr().String()
		}
	}
	// Publish until both have arrived: the first messages may go before
	// the connection is up (then the state is partial, as it should be).
	waitFor(t, "both engines' blocks", func() bool {
		for i, host := range []string{"a", "b", "stranger"} {
			if _, err := pubs[host].Publish(Batch{Events: []Event{block(uint64(100+i), 0, 1, 2)}}); err != nil {
				t.Fatal(err)
			}
		}
		return store.Blocks(0, MediumGPU) == 1 && store.Blocks(1, MediumGPU) == 1
	})
	if st, _ := store.Status(2); st != Unknown {
		t.Fatalf("a stranger's engine got state %v", st)
	}
	pubs["a"].Lose(Batch{Events: []Event{block(110, 100, 3, 4)}})
	waitFor(t, "engine a's lost last block, by the probe", func() bool { return store.Blocks(0, MediumGPU) == 2 })
}
