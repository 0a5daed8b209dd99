package llamacpp

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// ErrNotBuilt means llama-server has not been built on this machine.
var ErrNotBuilt = errors.New("llama-server not built (run scripts/llama-fleet.sh build)")

// Install is a llama.cpp build made by scripts/llama-fleet.sh.
type Install struct {
	// Dir is the cache directory holding it.
	Dir string
	// Server is the llama-server binary; Vocab the vocabulary-only GGUF
	// copied from llama.cpp's source tree.
	Server, Vocab string
}

// Dir is where scripts/llama-fleet.sh keeps its build: $KVROUTE_LLAMA_DIR,
// else kvroute/llama.cpp under the user's cache directory
// ($XDG_CACHE_HOME, or ~/.cache).
func Dir() (string, error) {
	if d := os.Getenv("KVROUTE_LLAMA_DIR"); d != "" {
		return d, nil
	}
	c, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("llamacpp: %w", err)
	}
	return filepath.Join(c, "kvroute", "llama.cpp"), nil
}

// Find returns the build in Dir, or an error wrapping ErrNotBuilt.
func Find() (Install, error) {
	dir, err := Dir()
	if err != nil {
		return Install{}, err
	}
	in := Install{
		Dir:    dir,
		Server: filepath.Join(dir, "bin", "llama-server"),
		Vocab:  filepath.Join(dir, "models", "ggml-vocab-llama-spm.gguf"),
	}
	for _, p := range []string{in.Server, in.Vocab} {
		if _, err := os.Stat(p); err != nil {
			return Install{}, fmt.Errorf("%w: %s is missing", ErrNotBuilt, p)
		}
	}
	return in, nil
}

// Require returns the build for a test or benchmark. A missing build fails
// the test under CI (CI=true), where .ci/run builds it, and skips it
// elsewhere.
func Require(tb testing.TB) Install {
	tb.Helper()
	in, err := Find()
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%v (.ci/run builds it under CI)", err)
		}
		tb.Skip(err)
	}
	return in
}

// modelVersion names the way WriteModel makes weights; it changes when
// they do, so that no cache keeps a model made the old way.
const modelVersion = 2

// Model returns the path of the random-weight model of shape cfg in the
// build's cache, writing it first if it is not there yet.
func (in Install) Model(cfg ModelConfig) (string, error) {
	if err := cfg.Validate(); err != nil {
		return "", err
	}
	path := filepath.Join(in.Dir, "models", fmt.Sprintf("random-llama-v%d-%dx%d-h%d-kv%d-ff%d-ctx%d-s%d.gguf",
		modelVersion, cfg.Dim, cfg.Layers, cfg.Heads, cfg.KVHeads, cfg.FeedForward, cfg.Context, cfg.Seed))
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := WriteModel(path, in.Vocab, cfg); err != nil {
		return "", err
	}
	return path, nil
}
