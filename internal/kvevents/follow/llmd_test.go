package follow

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/kvevents"
)

// llm-d's vLLM simulator (github.com/llm-d/llm-d-inference-sim) is a KV
// event publisher nobody here wrote: it hashes blocks with llm-d's own
// code, batches and numbers them its own way and connects to the router,
// naming itself in its topic. The Go module proxy refuses its module and
// llm-d-router's (403), so CI cannot build it; a binary built from their
// sources is given by path. docs/operations.md (Engine KV events) says how
// it was built here.
const llmdSimEnv = "KVROUTE_LLMD_SIM"

// llmdSim is one running simulator process.
type llmdSim struct {
	cmd  *exec.Cmd
	url  string
	port int
	out  bytes.Buffer
}

// freePort returns a loopback TCP port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

const (
	llmdModel     = "kvroute-interop"
	llmdBlockSize = 16
	llmdBlocks    = 60 // the test's first 6 conversations fit, the next 4 evict
)

// startLLMDSim starts the simulator on port, publishing its KV events to
// the listener at zmq and answering replay requests at replay, and waits
// until it serves.
func startLLMDSim(t *testing.T, bin string, port int, zmq, replay string, mapFormat bool) *llmdSim {
	t.Helper()
	s := &llmdSim{port: port, url: fmt.Sprintf("http://127.0.0.1:%d", port)}
	s.cmd = exec.Command(bin, "--model", llmdModel, "--port", strconv.Itoa(port),
		"--enable-kvcache", "true", "--kv-cache-size", strconv.Itoa(llmdBlocks), "--block-size", strconv.Itoa(llmdBlockSize),
		"--zmq-endpoint", zmq, "--kv-events-replay-endpoint", replay, "--event-batch-size", "8", "--use-vllm-map-event-format", strconv.FormatBool(mapFormat),
		"--mode", "echo", "--max-num-seqs", "4")
	// The topic names the pod by POD_IP: the router's backend of that
	// host and port.
	s.cmd.Env = append(os.Environ(), "POD_IP=127.0.0.1")
	s.cmd.Stdout, s.cmd.Stderr = &s.out, &s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.url + "/v1/models")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the simulator did not start: %v\n%s", err, s.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *llmdSim) stop() {
	if s.cmd.Process != nil && s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

func (s *llmdSim) post(t *testing.T, path string, body any) []byte {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(s.url+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: status %d: %s", path, resp.StatusCode, data)
	}
	return data
}

// tokens returns the simulator's own token ids for a conversation.
func (s *llmdSim) tokens(t *testing.T, msgs []map[string]string) []int32 {
	var r struct {
		Tokens []int64 `json:"tokens"`
	}
	if err := json.Unmarshal(s.post(t, "/tokenize", map[string]any{"model": llmdModel, "messages": msgs}), &r); err != nil {
		t.Fatal(err)
	}
	return kvevents.TokenIDs(r.Tokens)
}

// chat sends a conversation and returns the cached prompt tokens the
// simulator reports.
func (s *llmdSim) chat(t *testing.T, msgs []map[string]string) int {
	var r struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(s.post(t, "/v1/chat/completions", map[string]any{"model": llmdModel, "messages": msgs, "max_tokens": 4}), &r); err != nil {
		t.Fatal(err)
	}
	return r.Usage.Details.Cached
}

// TestLLMDSimulatorEvents follows a real llm-d simulator's KV events over
// ZMQ on 127.0.0.1 as kvroute serve does (--kv-events-listen, the engine
// named by its topic, --kv-events-replay-port), in both of its layouts: until its cache is full, every
// turn's cached prefix, as the store predicts it from the simulator's own
// token ids, is what the simulator then reports cached, and the store holds
// every block the prompts made; once it evicts, the store holds exactly its
// capacity, and the prediction is never more than the report (the
// simulator counts every block of the prompt it still holds, also past one
// it evicted, where vLLM, and the prediction, stop at the first missing
// block); a restarted simulator's state starts again from nothing.
func TestLLMDSimulatorEvents(t *testing.T) {
	bin := os.Getenv(llmdSimEnv)
	if bin == "" {
		t.Skipf("%s is not set: the Go module proxy does not serve llm-d's simulator (see docs/operations.md, Engine KV events)", llmdSimEnv)
	}
	for _, mapFormat := range []bool{false, true} {
		t.Run(fmt.Sprintf("map=%v", mapFormat), func(t *testing.T) { testLLMDSim(t, bin, mapFormat) })
	}
}

func testLLMDSim(t *testing.T, bin string, mapFormat bool) {
	port, listen, replay := freePort(t), freePort(t), freePort(t)
	b, err := fleet.ParseBackend(0, fmt.Sprintf("llmd=http://127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	zmq := fmt.Sprintf("tcp://127.0.0.1:%d", listen)
	f := NewFollower(FollowConfig{Listen: zmq, ReplayPort: replay, Retry: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); f.Wait() }()
	f.Start(ctx, []*fleet.Backend{b})
	store := f.Store()
	sim := startLLMDSim(t, bin, port, zmq, fmt.Sprintf("tcp://127.0.0.1:%d", replay), mapFormat)

	settle := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				st, orphans := store.Status(0)
				t.Fatalf("timed out waiting for %s: state %v, %d blocks, %d orphans\n%s", what, st, store.Blocks(0, kvevents.MediumGPU), orphans, sim.out.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	system := map[string]string{"role": "system", "content": strings.Repeat("You answer questions about the router's cache. ", 8)}
	held := map[uint64]bool{} // every full block of every prompt sent
	var predicted, reported, turns, exact, evicting int
	for conv := range 10 {
		msgs := []map[string]string{system}
		for turn := range 3 {
			msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("conversation %d turn %d: %s", conv, turn, strings.Repeat("tell me more ", 6+conv))})
			toks := sim.tokens(t, msgs)
			want := len(held)
			if want > llmdBlocks {
				want = llmdBlocks
			}
			// The events of the turns before have arrived when the store
			// holds what they stored (all of it until the cache is full).
			// ... and, its first batch numbered 1 where vLLM's is 0, the
			// replay has told the follower it missed none.
			settle("the previous turns' events", func() bool {
				st, _ := store.Status(0)
				return (turns == 0 || st == kvevents.Exact) && store.Blocks(0, kvevents.MediumGPU) == want
			})
			_, bs, gpu, _ := store.Match(0, func(bs int) []uint64 { return kvevents.TokenChain(nil, toks, bs) })
			got := sim.chat(t, msgs)
			if turns > 0 && bs != llmdBlockSize {
				t.Fatalf("block size %d from the events, want %d", bs, llmdBlockSize)
			}
			predicted, reported, turns = predicted+gpu*llmdBlockSize, reported+got, turns+1
			switch {
			case gpu*llmdBlockSize == got:
				exact++
			case len(held) <= llmdBlocks || gpu*llmdBlockSize > got:
				t.Fatalf("conversation %d turn %d: %d cached blocks predicted, %d tokens reported (%d blocks held, %d sent)",
					conv, turn, gpu, got, store.Blocks(0, kvevents.MediumGPU), len(held))
			}
			if len(held) > llmdBlocks {
				evicting++
			}
			for _, k := range kvevents.TokenChain(nil, toks, llmdBlockSize) {
				held[k] = true
			}
			msgs = append(msgs, map[string]string{"role": "assistant", "content": "noted"})
		}
	}
	t.Logf("%d turns (%d after the cache filled): %d predicted to the block; cached tokens predicted %d, reported %d; %d distinct blocks sent, %d held",
		turns, evicting, exact, predicted, reported, len(held), store.Blocks(0, kvevents.MediumGPU))
	if evicting == 0 || reported == 0 {
		t.Fatalf("the test must fill and evict the cache and hit it: %d blocks for %d, %d cached", len(held), llmdBlocks, reported)
	}
	settle("a full cache", func() bool { return store.Blocks(0, kvevents.MediumGPU) == llmdBlocks })

	// A restart: the same pod, a new process, its batches numbered from 0
	// again, its cache empty.
	sim.stop()
	sim = startLLMDSim(t, bin, port, zmq, fmt.Sprintf("tcp://127.0.0.1:%d", replay), mapFormat)
	msgs := []map[string]string{system, {"role": "user", "content": "after the restart"}}
	if got := sim.chat(t, msgs); got != 0 {
		t.Fatalf("a fresh simulator reported %d cached tokens", got)
	}
	n := len(kvevents.TokenChain(nil, sim.tokens(t, msgs), llmdBlockSize))
	settle("the restarted simulator's blocks only", func() bool {
		st, _ := store.Status(0)
		return st == kvevents.Exact && store.Blocks(0, kvevents.MediumGPU) == n
	})
}
