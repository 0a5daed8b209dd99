//go:build unix

package proxy

import (
	"testing"

	"github.com/kvroute/kvroute/internal/testfleet"
)

// deadPort is a 127.0.0.1 address where nothing listens and nothing else
// can until the test ends (testfleet.DeadAddr).
func deadPort(t testing.TB) string { return testfleet.DeadAddr(t) }
