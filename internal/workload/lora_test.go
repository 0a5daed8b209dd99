package workload

import (
	"testing"
	"time"
)

func TestLoRAWorkload(t *testing.T) {
	w, err := Load("lora", Options{Duration: time.Minute, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Load("lora", Options{Duration: time.Minute, Seed: 1})
	if len(w.Sessions) != len(again.Sessions) || w.Sessions[7].Adapter != again.Sessions[7].Adapter || w.Sessions[7].Turns[0].User != again.Sessions[7].Turns[0].User {
		t.Error("the same seed gave another workload")
	}
	counts := map[string]int{}
	for _, s := range w.Sessions {
		if s.Adapter == "" || len(s.Turns) < 1 || len(s.Turns) > 3 {
			t.Fatalf("session %s: model %q, %d turns", s.ID, s.Adapter, len(s.Turns))
		}
		counts[s.Adapter]++
	}
	if n := len(w.Adapters()); n < 30 || n > DefaultAdapters {
		t.Errorf("%d adapters in play, want most of %d", n, DefaultAdapters)
	}
	// Zipf 1.0 over 50: the first adapter takes about 22 % of the sessions.
	if share := float64(counts[AdapterName(0)]) / float64(len(w.Sessions)); share < 0.15 || share > 0.3 {
		t.Errorf("the most popular adapter has %.0f %% of the sessions, want about 22 %%", 100*share)
	}
	if _, err := Load("lora:0", Options{}); err == nil {
		t.Error("lora:0 accepted")
	}
	if w5, err := Load("lora:5", Options{Duration: time.Minute, Seed: 1}); err != nil || len(w5.Adapters()) != 5 {
		t.Errorf("lora:5: %d adapters, %v", len(w5.Adapters()), err)
	}
}
