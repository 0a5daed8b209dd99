// Package shareddata finds the project's public data files (real traces and
// prompts that are not part of the repository) and fetches them. They are
// looked for first in ../shared/data beside the checkout, where CI keeps
// them, then in the data directory that `kvroute data fetch` fills
// (DefaultDir). Tests take them through package sharedtest.
package shareddata

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrMissing means a data file is in none of the places looked in.
var ErrMissing = errors.New("data file not found")

// EnvDir names the environment variable that overrides DefaultDir.
const EnvDir = "KVROUTE_DATA_DIR"

// FetchStep is the command that downloads the data, for error messages.
const FetchStep = "kvroute data fetch"

// DefaultDir is where `kvroute data fetch` writes and where the commands look
// after ../shared/data: $KVROUTE_DATA_DIR, else kvroute/data in the user's
// cache directory ($XDG_CACHE_HOME or ~/.cache on Linux).
func DefaultDir() (string, error) {
	if d := os.Getenv(EnvDir); d != "" {
		return d, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no data directory (set %s): %w", EnvDir, err)
	}
	return filepath.Join(cache, "kvroute", "data"), nil
}

// Dirs returns the directories looked in, in order: ../shared/data above the
// module root of the working directory (when there is one), then DefaultDir
// (when it can be named).
func Dirs() []string {
	var dirs []string
	if root, ok := moduleRoot(); ok {
		dirs = append(dirs, filepath.Join(root, "..", "shared", "data"))
	}
	if d, err := DefaultDir(); err == nil {
		dirs = append(dirs, d)
	}
	return dirs
}

// Path returns the path of name (for example
// "mooncake/conversation_trace.jsonl") in the first of Dirs that holds it.
// When none does, the error wraps ErrMissing and names the step that fetches
// the data.
func Path(name string) (string, error) {
	dirs := Dirs()
	for _, d := range dirs {
		p := filepath.Join(d, filepath.FromSlash(name))
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", MissingError(name, dirs)
}

// MissingError is the error of a data file name found in none of dirs: it
// says where it looked and which command downloads the file.
func MissingError(name string, dirs []string) error {
	return fmt.Errorf("%w: %s is not in %s: run `%s` to download the public data sets (docs/data.md)",
		ErrMissing, name, strings.Join(dirs, " or "), FetchStep)
}

// moduleRoot returns the nearest directory at or above the working
// directory that holds a go.mod.
func moduleRoot() (string, bool) {
	dir, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}
