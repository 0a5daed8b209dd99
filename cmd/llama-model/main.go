// Command llama-model writes a llama-architecture GGUF model with random
// weights for llama.cpp's llama-server, into the cache of the llama.cpp build
// that scripts/llama-fleet.sh made, and prints its path. It writes nothing
// when a model of that shape is already there.
//
// The weights are random, so the text is gibberish; the compute, the KV
// cache and the prompt cache are what a trained model of this shape would
// have. It is written in Go, not with llama.cpp's Python writer, because
// that needs numpy, which this project's machines cannot install.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kvroute/kvroute/internal/llamacpp"
)

func main() {
	cfg := llamacpp.DefaultModel()
	fs := flag.NewFlagSet("llama-model", flag.ContinueOnError)
	fs.IntVar(&cfg.Dim, "dim", cfg.Dim, "embedding width")
	fs.IntVar(&cfg.Layers, "layers", cfg.Layers, "transformer blocks")
	fs.IntVar(&cfg.Heads, "heads", cfg.Heads, "attention heads")
	fs.IntVar(&cfg.KVHeads, "kv-heads", cfg.KVHeads, "key/value heads (fewer than -heads: grouped-query attention)")
	fs.IntVar(&cfg.FeedForward, "ff", cfg.FeedForward, "MLP width")
	fs.IntVar(&cfg.Context, "context", cfg.Context, "trained context length, tokens")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the weights")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "llama-model: unexpected arguments %q\n", fs.Args())
		os.Exit(2)
	}
	in, err := llamacpp.Find()
	if err != nil {
		fmt.Fprintf(os.Stderr, "llama-model: %v\n", err)
		os.Exit(1)
	}
	path, err := in.Model(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "llama-model: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(path)
}
