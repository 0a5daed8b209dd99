package engine

import (
	"strings"
	"testing"
	"time"
)

// The default profile reproduces the physical facts of DESIGN §4.
func TestDefaultProfileDerivations(t *testing.T) {
	p, err := LookupProfile(DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.KVBytesPerToken(); got != 128*1024 {
		t.Errorf("KV per token = %v bytes, want 128 KiB", got)
	}
	if b := p.Blocks(); b < 23_000 || b > 26_000 {
		t.Errorf("KV capacity = %d blocks, want about 25,000", b)
	}
	within := func(name string, got, want time.Duration, tol float64) {
		t.Helper()
		if d := float64(got-want) / float64(want); d > tol || d < -tol {
			t.Errorf("%s = %v, want %v ± %.0f%%", name, got, want, tol*100)
		}
	}
	var lone Work
	lone.AddChunk(1000, 1001)
	within("lone decode step", p.StepTime(lone), 7*time.Millisecond, 0.1)

	var big Work
	for range 48 {
		big.AddChunk(8191, 8192)
	}
	within("48 × 8k decode step", p.StepTime(big), 26*time.Millisecond, 0.1)

	// Prefill: about 27 µs per token for the linear layers plus 13 % for
	// attention over the chunk itself (Σ positions = 33.5M), so a first
	// 8192-token chunk takes about 0.25 s.
	var chunk Work
	chunk.AddChunk(0, 8192)
	within("8192-token prefill step", p.StepTime(chunk), 252*time.Millisecond, 0.02)

	// Attention makes the tokens of long prompts dearer.
	var early, late Work
	early.AddChunk(0, 8192)
	late.AddChunk(64*1024, 64*1024+8192)
	if r := float64(p.StepTime(late)) / float64(p.StepTime(early)); r < 1.5 {
		t.Errorf("a chunk at 64k context costs %.2f× one at the start, want > 1.5×", r)
	}
}

func TestProfilesParseAndValidate(t *testing.T) {
	for _, name := range ProfileNames() {
		p, err := LookupProfile(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Validate(); err != nil {
			t.Error(err)
		}
	}
	if _, err := LookupProfile("nope"); err == nil || !strings.Contains(err.Error(), DefaultProfile) {
		t.Errorf("unknown profile error %v should list the known ones", err)
	}
	tests := []struct {
		name, yaml, wantErr string
	}{
		{"not yaml", "profiles: [", "parse profiles"},
		{"empty", "profiles: []", "no profiles"},
		{"bad mfu", "profiles: [{name: x, params: 1e9, layers: 1, hidden: 1, kv_heads: 1, head_dim: 1, dtype_bytes: 2, max_model_len: 10, gpus: 1, peak_flops: 1, mem_bandwidth: 1, mfu: 2, mbu: 1, block_size: 16, num_gpu_blocks: 10, max_num_seqs: 1, max_num_batched_tokens: 1}]", "mfu"},
		{"ok", "profiles: [{name: x, params: 1e9, layers: 1, hidden: 1, kv_heads: 1, head_dim: 1, dtype_bytes: 2, max_model_len: 10, gpus: 1, peak_flops: 1, mem_bandwidth: 1, mfu: 1, mbu: 1, step_overhead: 2ms, block_size: 16, num_gpu_blocks: 10, max_num_seqs: 1, max_num_batched_tokens: 1}]", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, err := ParseProfiles([]byte(tt.yaml))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ps[0].StepOverhead != 2*time.Millisecond {
				t.Errorf("step_overhead = %v", ps[0].StepOverhead)
			}
		})
	}
}

func TestHashTokensChains(t *testing.T) {
	a := HashTokens(nil, seq(0, 40), 16)
	b := HashTokens(nil, append(seq(0, 32), seq(500, 8)...), 16)
	if len(a) != 2 || len(b) != 2 || a[0] != b[0] || a[1] != b[1] {
		t.Fatalf("equal full blocks must hash equal: %x %x", a, b)
	}
	c := HashTokens(nil, append([]int32{99}, seq(1, 31)...), 16)
	if c[1] == a[1] {
		t.Error("a block with the same tokens after a different prefix must hash differently")
	}
	if ChainHash(0, 7) == ChainHash(ChainHash(0, 1), 7) {
		t.Error("ChainHash ignores its parent")
	}
}
