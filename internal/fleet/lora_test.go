package fleet

import (
	"slices"
	"strings"
	"testing"
)

func TestScrapeLoRAInfo(t *testing.T) {
	tests := []struct {
		name                  string
		text                  string
		wantNil               bool
		wantRunning, wantWait []string
		wantMax               int
	}{
		{name: "absent", text: "vllm:num_requests_running 1\n", wantNil: true},
		{name: "latest series wins", text: "vllm:num_requests_running 3\n" +
			`vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters="c"} 1.7e9` + "\n" +
			`vllm:lora_requests_info{max_lora="4",running_lora_adapters="a",waiting_lora_adapters=""} 1.6e9` + "\n",
			wantRunning: []string{"a", "b"}, wantWait: []string{"c"}, wantMax: 4},
		{name: "idle", text: "vllm:num_requests_running 0\n" +
			`vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9` + "\n",
			wantMax: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s scraper
			m, _, err := s.parse(strings.NewReader(tt.text))
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantNil {
				if m.LoRA != nil {
					t.Fatalf("LoRA = %+v, want nil", m.LoRA)
				}
				return
			}
			if m.LoRA == nil {
				t.Fatal("LoRA = nil")
			}
			if !slices.Equal(m.LoRA.Running, tt.wantRunning) || !slices.Equal(m.LoRA.Waiting, tt.wantWait) || m.LoRA.MaxLoRAs != tt.wantMax {
				t.Errorf("LoRA = %+v, want running %v waiting %v max %d", m.LoRA, tt.wantRunning, tt.wantWait, tt.wantMax)
			}
		})
	}
}

func TestDiscoverAdapters(t *testing.T) {
	fb := newFakeBackend(t, vllmModels, vllmMetrics)
	f, bs, _ := newTestFleet(t, Options{}, fb)
	f.Refresh(t.Context())
	info := bs[0].Info()
	if !info.IsAdapter("sql-lora") || info.IsAdapter("meta-llama/Llama-3.1-8B-Instruct") {
		t.Errorf("Adapters = %v, want [sql-lora]", info.Adapters)
	}
}
