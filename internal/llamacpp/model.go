// Package llamacpp runs llama.cpp's llama-server, a real inference engine,
// for kvroute's end-to-end tests and benchmarks: it finds the binary that
// scripts/llama-fleet.sh builds, writes a llama model with random weights
// for it, and starts servers on loopback.
//
// The model's text is gibberish, but everything kvroute cares about is
// real: tokenization, prefill and decode compute, slots, the prompt cache,
// usage.cached_tokens, timings and metrics.
package llamacpp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvroute/kvroute/internal/gguf"
)

// ModelConfig is the shape of a random-weight llama model. Sizes are in
// elements.
type ModelConfig struct {
	// Dim is the embedding width; Heads must divide it.
	Dim int
	// Layers is the number of transformer blocks.
	Layers int
	// Heads and KVHeads are the attention heads (KVHeads < Heads is
	// grouped-query attention; KVHeads must divide Heads).
	Heads, KVHeads int
	// FeedForward is the width of each block's MLP.
	FeedForward int
	// Context is the context length the model says it was trained for,
	// in tokens; llama-server's -c may not usefully exceed it.
	Context int
	// Seed makes the weights reproducible.
	Seed uint64
}

// DefaultModel is a model big enough that prefill costs real time on a CPU
// (about 58M parameters, 233 MB in F32: a 1,500-token prompt takes about a
// second on two threads) and small enough that three servers share two
// cores.
func DefaultModel() ModelConfig {
	return ModelConfig{Dim: 512, Layers: 8, Heads: 8, KVHeads: 8, FeedForward: 1408, Context: 32768, Seed: 1}
}

// Validate reports the first impossible setting.
func (c ModelConfig) Validate() error {
	switch {
	case c.Dim <= 0 || c.Layers <= 0 || c.Heads <= 0 || c.KVHeads <= 0 || c.FeedForward <= 0 || c.Context <= 0:
		return fmt.Errorf("llamacpp: model sizes must be positive: %+v", c)
	case c.Dim%c.Heads != 0:
		return fmt.Errorf("llamacpp: %d heads do not divide dimension %d", c.Heads, c.Dim)
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("llamacpp: %d KV heads do not divide %d heads", c.KVHeads, c.Heads)
	case (c.Dim/c.Heads)%2 != 0:
		return fmt.Errorf("llamacpp: head size %d must be even for RoPE", c.Dim/c.Heads)
	}
	return nil
}

// ErrNoVocabulary means the vocabulary file has no tokenizer.ggml.tokens.
var ErrNoVocabulary = errors.New("llamacpp: no tokenizer.ggml.tokens in the vocabulary file")

// WriteModel writes to out a llama-architecture GGUF model of shape cfg with
// random weights and the tokenizer of vocab (a vocabulary-only GGUF such as
// llama.cpp's models/ggml-vocab-llama-spm.gguf). The file appears whole or
// not at all.
func WriteModel(out, vocab string, cfg ModelConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	vf, err := os.Open(vocab)
	if err != nil {
		return fmt.Errorf("llamacpp: vocabulary: %w", err)
	}
	v, err := gguf.Read(vf)
	vf.Close()
	if err != nil {
		return fmt.Errorf("llamacpp: vocabulary %s: %w", vocab, err)
	}
	tokens, ok := mustGet[[]string](v, "tokenizer.ggml.tokens")
	if !ok || len(tokens) == 0 {
		return ErrNoVocabulary
	}
	// Which tokens may be generated: the normal ones (type 1). Without
	// types, all may.
	normal := make([]bool, len(tokens))
	types, _ := mustGet[[]int32](v, "tokenizer.ggml.token_type")
	for i := range normal {
		normal[i] = len(types) != len(tokens) || types[i] == tokenNormal
	}
	kvs := modelKVs(cfg, len(tokens))
	for _, kv := range v.KVs {
		// Only the tokenizer carries over: the vocabulary file's own
		// hyperparameters describe a model it doesn't contain.
		if strings.HasPrefix(kv.Key, "tokenizer.") {
			kvs = append(kvs, kv)
		}
	}

	tmp, err := os.CreateTemp(filepath.Dir(out), ".model-*.gguf")
	if err != nil {
		return fmt.Errorf("llamacpp: %w", err)
	}
	defer os.Remove(tmp.Name())              // after a successful rename this fails harmlessly
	if err := tmp.Chmod(0o644); err != nil { // CreateTemp makes it private; a model is not a secret
		tmp.Close()
		return fmt.Errorf("llamacpp: %w", err)
	}
	if err := gguf.Write(tmp, kvs, modelTensors(cfg, normal)); err != nil {
		tmp.Close()
		return fmt.Errorf("llamacpp: writing %s: %w", out, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("llamacpp: %w", err)
	}
	return os.Rename(tmp.Name(), out)
}

func mustGet[T any](f *gguf.File, key string) (T, bool) {
	v, ok := f.Get(key)
	t, ok2 := v.(T)
	return t, ok && ok2
}

// modelKVs is the metadata llama.cpp's llama architecture loads.
func modelKVs(cfg ModelConfig, vocab int) []gguf.KV {
	return []gguf.KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "general.name", Value: fmt.Sprintf("kvroute random llama %dx%d", cfg.Dim, cfg.Layers)},
		{Key: "general.file_type", Value: uint32(0)}, // all F32
		{Key: "llama.vocab_size", Value: uint32(vocab)},
		{Key: "llama.context_length", Value: uint32(cfg.Context)},
		{Key: "llama.embedding_length", Value: uint32(cfg.Dim)},
		{Key: "llama.block_count", Value: uint32(cfg.Layers)},
		{Key: "llama.feed_forward_length", Value: uint32(cfg.FeedForward)},
		{Key: "llama.attention.head_count", Value: uint32(cfg.Heads)},
		{Key: "llama.attention.head_count_kv", Value: uint32(cfg.KVHeads)},
		{Key: "llama.rope.dimension_count", Value: uint32(cfg.Dim / cfg.Heads)},
		{Key: "llama.rope.freq_base", Value: float32(10000)},
		{Key: "llama.attention.layer_norm_rms_epsilon", Value: float32(1e-5)},
	}
}

// tokenNormal is llama.cpp's token type of ordinary text pieces; the others
// are unknown, control, user-defined, unused and byte-fallback tokens.
const tokenNormal = 1

// Steering away from special tokens, through one hidden dimension: every
// token embedding holds steerEmbed in dimension 0, so that the residual
// stream, and the final norm's output, stay positive there whatever the
// random layers add (each adds about ±0.3 per dimension), and the output
// row of every token that is not normal holds -steerOutput there, so that
// its logit is about ten below the others'.
//
// Why: a random model samples byte-fallback tokens about once in a hundred
// tokens, and a lone byte of a multi-byte character is invalid UTF-8, on
// which llama-server's chat output parser fails the request mid-stream. A
// trained model practically never does that. The compute is unchanged.
const (
	steerEmbed  = 4
	steerOutput = 3
)

// modelTensors lists the llama architecture's tensors (dimensions in
// ggml's order: input width first) for a vocabulary whose generable tokens
// are marked in normal. Matrices are drawn from N(0, 0.02²), the usual
// initialisation, so that activations stay finite through the layers; norm
// weights are 1. Each tensor has its own random stream, so the weights do
// not depend on the order tensors are written in.
func modelTensors(cfg ModelConfig, normal []bool) []gguf.Tensor {
	d, ff, vocab := uint64(cfg.Dim), uint64(cfg.FeedForward), uint64(len(normal))
	kv := d / uint64(cfg.Heads) * uint64(cfg.KVHeads)
	var ts []gguf.Tensor
	// add adds a tensor; first, if not nil, gives element 0 of row r (the
	// steering dimension) instead of a random draw.
	add := func(name string, ones bool, first func(r uint64) float32, dims ...uint64) {
		seed := uint64(len(ts))
		ts = append(ts, gguf.Tensor{
			Info: gguf.TensorInfo{Name: name, Dims: dims, Type: gguf.TensorF32},
			Data: func(w io.Writer) error {
				n := uint64(1)
				for _, x := range dims {
					n *= x
				}
				if ones {
					return writeConst(w, n, 1)
				}
				return writeNormal(w, dims[0], n/dims[0], 0.02, rand.New(rand.NewPCG(cfg.Seed, seed)), first)
			},
		})
	}
	add("token_embd.weight", false, func(uint64) float32 { return steerEmbed }, d, vocab)
	add("output_norm.weight", true, nil, d)
	add("output.weight", false, func(r uint64) float32 {
		if normal[r] {
			return 0
		}
		return -steerOutput
	}, d, vocab)
	for i := range cfg.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		add(p+"attn_norm.weight", true, nil, d)
		add(p+"attn_q.weight", false, nil, d, d)
		add(p+"attn_k.weight", false, nil, d, kv)
		add(p+"attn_v.weight", false, nil, d, kv)
		add(p+"attn_output.weight", false, nil, d, d)
		add(p+"ffn_norm.weight", true, nil, d)
		add(p+"ffn_gate.weight", false, nil, d, ff)
		add(p+"ffn_down.weight", false, nil, ff, d)
		add(p+"ffn_up.weight", false, nil, d, ff)
	}
	return ts
}

func writeConst(w io.Writer, n uint64, v float32) error {
	bw := bufio.NewWriter(w)
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
	for range n {
		bw.Write(b[:])
	}
	return bw.Flush()
}

// writeNormal writes rows × width draws from N(0, std²), row by row; with
// first set, each row's element 0 is first(row) instead.
func writeNormal(w io.Writer, width, rows uint64, std float64, rng *rand.Rand, first func(uint64) float32) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	var b [4]byte
	for r := range rows {
		for c := range width {
			v := float32(rng.NormFloat64() * std)
			if c == 0 && first != nil {
				v = first(r)
			}
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
			bw.Write(b[:])
		}
	}
	return bw.Flush()
}
