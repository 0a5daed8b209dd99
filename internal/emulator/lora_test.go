package emulator

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
)

func startLoRAServer(t *testing.T) string {
	t.Helper()
	l := engine.LoRA{MaxLoRAs: 1, MaxCPULoRAs: 2, LoadDisk: 80 * time.Millisecond, LoadCPU: 3 * time.Millisecond}
	_, url := startServer(t, Config{LoRA: &l, LoRAModules: []LoRAModule{{Name: "sql", Path: "/adapters/sql"}}}, nil)
	return url
}

func TestLoRAModelsListAdapters(t *testing.T) {
	url := startLoRAServer(t)
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Root   string  `json:"root"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	if len(list.Data) != 2 || list.Data[0].ID != testModel || list.Data[0].Parent != nil {
		t.Fatalf("models %+v, want the base model then sql", list.Data)
	}
	if a := list.Data[1]; a.ID != "sql" || a.Root != "/adapters/sql" || a.Parent == nil || *a.Parent != testModel {
		t.Errorf("adapter card %+v, want sql with root /adapters/sql and parent %s", a, testModel)
	}
}

func TestLoRARequestsAndPrefixCache(t *testing.T) {
	url := startLoRAServer(t)
	body := func(model string) map[string]any {
		return map[string]any{"model": model, "prompt": words(400), "max_tokens": 4}
	}
	first, _ := complete(t, url+"/v1/completions", body("sql"))
	if first.Model != "sql" {
		t.Errorf("response names model %q, want sql", first.Model)
	}
	again, _ := complete(t, url+"/v1/completions", body("sql"))
	if again.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Error("the same prompt under the same adapter found nothing cached")
	}
	base, _ := complete(t, url+"/v1/completions", body(testModel))
	if n := base.Usage.PromptTokensDetails.CachedTokens; n != 0 {
		t.Errorf("the base model reused %d tokens cached under an adapter", n)
	}
	resp, data := post(t, url+"/v1/completions", body("nope"))
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(data), "does not exist") {
		t.Errorf("unknown adapter: %d %s, want 404 does not exist", resp.StatusCode, data)
	}
}

func TestLoRALoadUnload(t *testing.T) {
	url := startLoRAServer(t)
	tests := []struct {
		name, path string
		body       string
		wantStatus int
		wantText   string
	}{
		{"load", "/v1/load_lora_adapter", `{"lora_name":"chat","lora_path":"/adapters/chat"}`, 200, "Success: LoRA adapter 'chat' added successfully."},
		{"load twice", "/v1/load_lora_adapter", `{"lora_name":"chat","lora_path":"/adapters/chat"}`, 400, "has already been loaded"},
		{"load in place", "/v1/load_lora_adapter", `{"lora_name":"chat","lora_path":"/adapters/chat2","load_inplace":true}`, 200, "added successfully"},
		{"load without path", "/v1/load_lora_adapter", `{"lora_name":"x"}`, 400, "must be provided"},
		{"load bad JSON", "/v1/load_lora_adapter", `{"lora_name":`, 400, "error"},
		{"unload", "/v1/unload_lora_adapter", `{"lora_name":"chat"}`, 200, "Success: LoRA adapter 'chat' removed successfully."},
		{"unload unknown", "/v1/unload_lora_adapter", `{"lora_name":"chat"}`, 404, "cannot be found"},
	}
	for _, tt := range tests {
		resp, data := post(t, url+tt.path, tt.body)
		if resp.StatusCode != tt.wantStatus || !strings.Contains(string(data), tt.wantText) {
			t.Errorf("%s: %d %s, want %d %q", tt.name, resp.StatusCode, data, tt.wantStatus, tt.wantText)
		}
	}
	resp, _ := post(t, url+"/v1/completions", map[string]any{"model": "chat", "prompt": "hi", "max_tokens": 2})
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("request for an unloaded adapter: %d, want 404", resp.StatusCode)
	}
}

func TestLoRAEndpointsOffWithoutLoRA(t *testing.T) {
	_, url := startServer(t, Config{}, nil)
	resp, _ := post(t, url+"/v1/load_lora_adapter", `{"lora_name":"a","lora_path":"/a"}`)
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("load without LoRA: %d, want 404", resp.StatusCode)
	}
}

func TestLoRAMetric(t *testing.T) {
	url := startLoRAServer(t)
	complete(t, url+"/v1/completions", map[string]any{"model": "sql", "prompt": words(50), "max_tokens": 2})
	fams := scrape(t, url)
	mf := fams["vllm:lora_requests_info"]
	if mf == nil || len(mf.GetMetric()) != 1 {
		t.Fatalf("vllm:lora_requests_info: %v", mf)
	}
	labels := map[string]string{}
	for _, l := range mf.GetMetric()[0].GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["max_lora"] != "1" || labels["running_lora_adapters"] != "" || labels["waiting_lora_adapters"] != "" {
		t.Errorf("labels %v, want max_lora 1 and nothing running or waiting", labels)
	}
	if v := mf.GetMetric()[0].GetGauge().GetValue(); v < 1e9 {
		t.Errorf("value %v, want the time it was read (Unix seconds)", v)
	}
	// The module was loaded into the CPU cache at start; the request put it
	// in a GPU slot from there.
	if v := metricValue(t, fams, "kvroute_emulator_lora_loads_total"); v != 1 {
		t.Errorf("kvroute_emulator_lora_loads_total = %v, want 1 (the module at start)", v)
	}
}
