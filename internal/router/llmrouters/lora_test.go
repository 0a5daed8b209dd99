package llmrouters

import (
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/routertest"
)

func TestLoRAAffinityScores(t *testing.T) {
	tests := []struct {
		name string
		info *fleet.LoRAInfo
		want float64
	}{
		{"running", &fleet.LoRAInfo{Running: []string{"sql", "x"}, MaxLoRAs: 2}, 1},
		{"room for one more", &fleet.LoRAInfo{Running: []string{"x"}, MaxLoRAs: 2}, 0.8},
		{"waiting and full", &fleet.LoRAInfo{Running: []string{"x", "y"}, Waiting: []string{"sql"}, MaxLoRAs: 2}, 0.6},
		{"full", &fleet.LoRAInfo{Running: []string{"x"}, Waiting: []string{"y"}, MaxLoRAs: 2}, 0},
		{"waiting counted once", &fleet.LoRAInfo{Running: []string{"x"}, Waiting: []string{"x"}, MaxLoRAs: 2}, 0.8},
		{"no adapters reported", nil, 0},
	}
	bs := routertest.Backends(1)
	for _, tt := range tests {
		p := NewLLMDLoRA(bs, 1, Config{}, func(*fleet.Backend) *fleet.Metrics { return &fleet.Metrics{LoRA: tt.info} })
		if got := p.loraAffinity(bs[0], "sql"); got != tt.want {
			t.Errorf("%s: score %v, want %v", tt.name, got, tt.want)
		}
	}
}

// Otherwise equal backends: llmd-lora picks the one running the adapter,
// llmd-default either.
func TestLLMDLoRAPrefersRunningAdapter(t *testing.T) {
	bs := routertest.Backends(2)
	m := map[*fleet.Backend]*fleet.Metrics{
		bs[0]: {LoRA: &fleet.LoRAInfo{Running: []string{"x"}, MaxLoRAs: 1}, KVUsage: 0.1},
		bs[1]: {LoRA: &fleet.LoRAInfo{Running: []string{"sql"}, MaxLoRAs: 1}, KVUsage: 0.1},
	}
	p := NewLLMDLoRA(bs, 1, Config{}, func(b *fleet.Backend) *fleet.Metrics { return m[b] })
	if p.Name() != "llmd-lora" {
		t.Errorf("Name = %q", p.Name())
	}
	for i := range 5 {
		d := routertest.Pick(t, p, &router.Request{Model: "sql", Prompt: routertest.Words(i, 300), PromptTokens: 75}, bs)
		if d.Backend != bs[1] {
			t.Fatalf("pick %d went to %s, not to the backend running the adapter", i, d.Backend.Name)
		}
	}
}
