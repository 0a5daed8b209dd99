package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/internal/server"
)

// A start-up error names the setting to change: its flag and its key in
// the --config file (the environment variable follows from the flag:
// envName). "address already in use" alone sends an operator reading the
// docs for which of three listeners it was.

// settingError is err caused by the setting flag, spelled key in the
// --config file ("" when the command has no config file).
type settingError struct {
	flag, key string
	err       error
}

// Error reads "metrics listener: listen tcp 127.0.0.1:9464: bind: address
// already in use (--metrics-listen, config key metrics_listen)".
func (e *settingError) Error() string {
	if e.key == "" {
		return fmt.Sprintf("%v (--%s)", e.err, e.flag)
	}
	return fmt.Sprintf("%v (--%s, config key %s)", e.err, e.flag, e.key)
}

func (e *settingError) Unwrap() error { return e.err }

// configKey is flag name's key in the --config file.
func configKey(name string) string { return strings.ReplaceAll(name, "-", "_") }

// bySetting wraps a non-nil err with the flag that set what failed and
// its config key.
func bySetting(name string, err error) error {
	if err == nil {
		return nil
	}
	return &settingError{flag: name, key: configKey(name), err: err}
}

// byListener names the flag of the listener a server.ListenError is
// about; flags maps listener names to flag names. Other errors are
// returned as they are.
func byListener(err error, flags map[string]string) error {
	if le, ok := errors.AsType[*server.ListenError](err); ok {
		if name, ok := flags[le.Listener]; ok {
			return bySetting(name, err)
		}
	}
	return err
}

// backendError names where backends are given: --backend on the command
// line (or KVROUTE_BACKEND), the backends list in the --config file.
func backendError(err error) error {
	return &settingError{flag: "backend", key: "backends", err: err}
}

// closestKey is the config key among keys nearest to key by edit
// distance, when it is near enough to be a typo (at most a third of its
// letters off), else "".
func closestKey(key string, keys []string) string {
	best, bestD := "", len(key)/3+1
	for _, k := range keys {
		if d := editDistance(key, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
