// Package sharedtest gives tests and benchmarks the project's shared data
// files (see package shareddata). It imports testing, so only _test.go files
// import it; the binary links shareddata alone.
package sharedtest

import (
	"os"
	"testing"

	"github.com/kvroute/kvroute/internal/shareddata"
)

// Require returns the path of name for a test or benchmark. A missing file
// fails the test under CI (CI=true), where the data must be present, and
// skips it elsewhere.
func Require(tb testing.TB, name string) string {
	tb.Helper()
	p, err := shareddata.Path(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%v (CI expects ../shared/data beside the checkout)", err)
		}
		tb.Skip(err)
	}
	return p
}
