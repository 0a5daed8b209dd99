// Package shareddata finds the project's shared data files (real traces and
// prompts that are not part of the repository), which live in ../shared/data
// beside the checkout. Tests take them through package sharedtest.
package shareddata

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// ErrMissing means the shared data directory or a file in it is absent.
var ErrMissing = errors.New("shared data not found")

// Path returns the path of name (for example
// "mooncake/conversation_trace.jsonl") in ../shared/data, looked up from the
// module root above the working directory.
func Path(name string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "..", "shared", "data", name)
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("%w: %s", ErrMissing, p)
			}
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%w: no go.mod above the working directory", ErrMissing)
		}
		dir = parent
	}
}
