package engine

import (
	"strings"
	"testing"
)

func TestParseFleet(t *testing.T) {
	tests := []struct {
		name, spec string
		want       []string // profile=model per server, for 3 backends
		wantErr    string
	}{
		{"one profile", "h100-llama3-8b", []string{"h100-llama3-8b=meta-llama/Llama-3.1-8B-Instruct", "h100-llama3-8b=meta-llama/Llama-3.1-8B-Instruct", "h100-llama3-8b=meta-llama/Llama-3.1-8B-Instruct"}, ""},
		{"two generations", "h100-llama3-8b:1, a100-llama3-8b:2", []string{"h100-llama3-8b=meta-llama/Llama-3.1-8B-Instruct", "a100-llama3-8b=meta-llama/Llama-3.1-8B-Instruct", "a100-llama3-8b=meta-llama/Llama-3.1-8B-Instruct"}, ""},
		{"renamed model", "h100-llama3-8b=code:1", []string{"h100-llama3-8b=code"}, ""},
		{"no count in a list", "h100-llama3-8b:2,a100-llama3-8b", nil, "has no count"},
		{"zero count", "h100-llama3-8b:0", nil, "at least 1"},
		{"bad count", "h100-llama3-8b:x", nil, "whole number"},
		{"unknown profile", "h200:2", nil, "unknown profile"},
		{"empty model", "h100-llama3-8b=:2", nil, "empty model"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parts, err := ParseFleet(tt.spec)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range FleetServers(parts, 3) {
				got = append(got, p.Name+"="+p.Model)
			}
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("servers %v, want %v", got, tt.want)
			}
		})
	}
}

// The A100 profile is the H100's on the older GPU: the same model and
// KV capacity, prefill about 3.2× and a lone decode about 1.5× slower.
func TestA100Profile(t *testing.T) {
	h, err := LookupProfile("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	a, err := LookupProfile("a100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	if a.Model != h.Model || a.Blocks() != h.Blocks() || a.GPU() == h.GPU() {
		t.Fatalf("a100: model %s, %d blocks, GPU %s; want the H100's model and blocks on another GPU", a.Model, a.Blocks(), a.GPU())
	}
	var prefill Work
	prefill.AddChunk(0, 8192)
	decode := Work{Tokens: 1, ContextTokens: 1000}
	pr := float64(a.StepTime(prefill)) / float64(h.StepTime(prefill))
	dr := float64(a.StepTime(decode)) / float64(h.StepTime(decode))
	if pr < 3.0 || pr > 3.3 || dr < 1.45 || dr > 1.6 {
		t.Errorf("A100 over H100: prefill %.2f×, decode %.2f×; want 3.0–3.3× and 1.45–1.6×", pr, dr)
	}
}
