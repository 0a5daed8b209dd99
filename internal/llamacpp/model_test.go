package llamacpp

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvroute/kvroute/internal/gguf"
)

// writeVocab writes a vocabulary-only GGUF like llama.cpp's, with
// hyperparameters of a model it doesn't contain.
func writeVocab(t *testing.T, tokens []string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "vocab.gguf")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kvs := []gguf.KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "llama.block_count", Value: uint32(32)},
		{Key: "tokenizer.ggml.model", Value: "llama"},
		{Key: "tokenizer.ggml.bos_token_id", Value: uint32(1)},
	}
	if tokens != nil {
		kvs = append(kvs, gguf.KV{Key: "tokenizer.ggml.tokens", Value: tokens})
	}
	if err := gguf.Write(f, kvs, nil); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestWriteModel(t *testing.T) {
	vocab := writeVocab(t, []string{"<unk>", "<s>", "</s>", "a", "b"})
	cfg := ModelConfig{Dim: 8, Layers: 2, Heads: 2, KVHeads: 1, FeedForward: 12, Context: 64, Seed: 3}
	out := filepath.Join(t.TempDir(), "m.gguf")
	if err := WriteModel(out, vocab, cfg); err != nil {
		t.Fatal(err)
	}
	fh, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	m, err := gguf.Read(fh)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"general.architecture":          "llama",
		"llama.block_count":             uint32(2), // ours, not the vocabulary file's 32
		"llama.embedding_length":        uint32(8),
		"llama.attention.head_count_kv": uint32(1),
		"llama.rope.dimension_count":    uint32(4),
		"tokenizer.ggml.model":          "llama",
		"tokenizer.ggml.bos_token_id":   uint32(1),
	}
	for k, v := range want {
		if got, _ := m.Get(k); got != v {
			t.Errorf("%s = %v, want %v", k, got, v)
		}
	}
	shapes := map[string][]uint64{}
	for _, ti := range m.Tensors {
		shapes[ti.Name] = ti.Dims
	}
	if len(shapes) != 3+2*9 {
		t.Errorf("%d tensors, want %d", len(shapes), 3+2*9)
	}
	for name, dims := range map[string][]uint64{
		"token_embd.weight":     {8, 5},
		"blk.1.attn_k.weight":   {8, 4}, // one KV head of 4
		"blk.0.ffn_down.weight": {12, 8},
	} {
		if got := shapes[name]; len(got) != len(dims) || got[0] != dims[0] || got[1] != dims[1] {
			t.Errorf("%s: dims %v, want %v", name, got, dims)
		}
	}

	// The same seed gives the same file.
	again := filepath.Join(t.TempDir(), "m.gguf")
	if err := WriteModel(again, vocab, cfg); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(out)
	b, _ := os.ReadFile(again)
	if string(a) != string(b) {
		t.Error("two models of the same seed differ")
	}
}

func TestWriteModelErrors(t *testing.T) {
	good := DefaultModel()
	bad := good
	bad.Heads = 7
	tests := []struct {
		name  string
		vocab func(t *testing.T) string
		cfg   ModelConfig
		is    error
	}{
		{"heads do not divide dim", func(t *testing.T) string { return writeVocab(t, []string{"a"}) }, bad, nil},
		{"no tokens", func(t *testing.T) string { return writeVocab(t, nil) }, good, ErrNoVocabulary},
		{"not a GGUF file", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "v")
			os.WriteFile(p, []byte("hello"), 0o644)
			return p
		}, good, gguf.ErrFormat},
		{"missing", func(t *testing.T) string { return filepath.Join(t.TempDir(), "none") }, good, os.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "m.gguf")
			err := WriteModel(out, tt.vocab(t), tt.cfg)
			if err == nil || (tt.is != nil && !errors.Is(err, tt.is)) {
				t.Fatalf("err = %v, want %v", err, tt.is)
			}
			if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a failed write left %s behind", out)
			}
		})
	}
}

func TestFindMissing(t *testing.T) {
	t.Setenv("KVROUTE_LLAMA_DIR", t.TempDir())
	if _, err := Find(); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("err = %v, want ErrNotBuilt", err)
	}
}
