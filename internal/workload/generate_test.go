package workload

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/shareddata/sharedtest"
	"github.com/kvroute/kvroute/internal/tokenizer"
)

func TestLoadSyntheticWorkloads(t *testing.T) {
	for _, spec := range []string{"chat", "shared-prefix", "agentic", "long-gen", "mixed"} {
		t.Run(spec, func(t *testing.T) {
			w, err := Load(spec, Options{Seed: 1, Duration: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			again, _ := Load(spec, Options{Seed: 1, Duration: 30 * time.Second})
			if w.Requests() == 0 || w.Requests() != again.Requests() || w.Description == "" {
				t.Fatalf("%d requests (again %d), %q", w.Requests(), again.Requests(), w.Description)
			}
			for i := 1; i < len(w.Sessions); i++ {
				if w.Sessions[i].Start < w.Sessions[i-1].Start {
					t.Fatal("sessions out of order")
				}
			}
			for _, s := range w.Sessions {
				for _, turn := range s.Turns {
					if turn.MaxTokens < 1 || turn.Text() == "" {
						t.Fatalf("turn %+v", turn)
					}
				}
			}
		})
	}
}

func TestMixedHasHeavyAndLight(t *testing.T) {
	w, err := Load("mixed", Options{Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	heavy := 0
	for _, s := range w.Sessions {
		turn := s.Turns[0]
		n := tokenizer.Count(turn.Text())
		if turn.Heavy {
			heavy++
			if n < 20_000 || n > 60_000 {
				t.Fatalf("heavy request of %d tokens", n)
			}
		} else if n > 50 {
			t.Fatalf("light request of %d tokens", n)
		}
	}
	if frac := float64(heavy) / float64(len(w.Sessions)); frac < 0.03 || frac > 0.07 {
		t.Errorf("%.3f of requests heavy, want about 0.05", frac)
	}
}

func TestLoadRejectsBadSpecs(t *testing.T) {
	for _, spec := range []string{"nope", "mooncake", "mooncake:/nonexistent", "azure:", "multiturn"} {
		if _, err := Load(spec, Options{}); err == nil {
			t.Errorf("%q: no error", spec)
		}
	}
}

func TestRealTraces(t *testing.T) {
	mc := sharedtest.Require(t, "mooncake/conversation_trace.jsonl")
	w, err := Load("mooncake:"+mc, Options{Duration: 5 * time.Minute, Compress: 5})
	if err != nil {
		t.Fatal(err)
	}
	// The trace runs at 3.4 requests/s: about 1,000 requests in 5 minutes,
	// replayed in one.
	if n := len(w.Sessions); n < 800 || n > 1300 {
		t.Errorf("%d requests in the first 5 minutes", n)
	}
	if last := w.Sessions[len(w.Sessions)-1].Start; last > time.Minute {
		t.Errorf("compressed 5× the last arrival is at %v", last)
	}
	first := w.Sessions[0].Turns[0]
	if got := tokenizer.Count(first.Text()); got != first.Tokens {
		t.Errorf("first request has %d tokens, the trace says %d", got, first.Tokens)
	}
	az := sharedtest.Require(t, "azure/AzureLLMInferenceTrace_conv.csv")
	w, err = Load("azure:"+az, Options{Duration: time.Minute})
	if err != nil || len(w.Sessions) < 50 || !strings.Contains(w.Description, "Azure") {
		t.Fatalf("azure: %d requests, %v", len(w.Sessions), err)
	}
	mt := sharedtest.Require(t, DefaultMTBench)
	w, err = Load("multiturn:"+mt, Options{Seed: 1, Duration: time.Minute})
	if err != nil || len(w.Sessions) == 0 || len(w.Sessions[0].Turns) != 6 {
		t.Fatalf("multiturn: %v", err)
	}
}

// The Azure traces carry each request's real output length: the replay
// asks for exactly that many tokens (the emulator and the simulator
// generate max_tokens), so long generations reach the fleet as they were.
func TestAzureKeepsOutputLengths(t *testing.T) {
	az := sharedtest.Require(t, "azure/AzureLLMInferenceTrace_conv.csv")
	w, err := Load("azure:"+az, Options{Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// The trace's first three records: 374 → 44, 396 → 109, 879 → 55 tokens.
	for i, want := range [][2]int{{374, 44}, {396, 109}, {879, 55}} {
		turn := w.Sessions[i].Turns[0]
		if turn.Tokens != want[0] || turn.MaxTokens != want[1] {
			t.Errorf("request %d: %d prompt and %d output tokens, want %d and %d", i, turn.Tokens, turn.MaxTokens, want[0], want[1])
		}
	}
}

func TestLongGenHasLongTurns(t *testing.T) {
	w, err := Load("long-gen", Options{Seed: 3, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	long, all := 0, 0
	for _, s := range w.Sessions {
		for _, turn := range s.Turns {
			all++
			switch {
			case turn.MaxTokens >= 1500:
				long++
				if turn.MaxTokens > 6000 {
					t.Fatalf("a turn asks for %d tokens", turn.MaxTokens)
				}
			case turn.MaxTokens > 500:
				t.Fatalf("a short turn asks for %d tokens", turn.MaxTokens)
			}
		}
	}
	if frac := float64(long) / float64(all); frac < 0.08 || frac > 0.2 {
		t.Errorf("%.3f of turns ask for long generations, want about 0.13", frac)
	}
}

// A workload read from a file is named by its data set's file name, not by
// the path it was read from: reports carry the name in their titles.
func TestLoadNamesTheDataSetNotThePath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "somewhere", "mooncake")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "conversation_trace.jsonl")
	trace := `{"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]}` + "\n" +
		`{"timestamp": 500, "input_length": 512, "output_length": 5, "hash_ids": [1]}` + "\n"
	if err := os.WriteFile(path, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := Load("mooncake:"+path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != "mooncake:conversation_trace.jsonl" {
		t.Errorf("Name = %q, want mooncake:conversation_trace.jsonl", w.Name)
	}
	if w, _ := Load("chat", Options{Duration: time.Minute}); w.Name != "chat" {
		t.Errorf("Name = %q, want chat", w.Name)
	}
}
