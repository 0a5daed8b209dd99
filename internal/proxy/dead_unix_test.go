//go:build unix

package proxy

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/kvroute/kvroute/internal/testfleet"
)

// deadPort is a 127.0.0.1 address where nothing listens and nothing else
// can until the test ends (testfleet.DeadAddr).
func deadPort(t testing.TB) string { return testfleet.DeadAddr(t) }

// A dead port refuses connections, and no listener is given it or shares
// it while the test runs.
func TestDeadPortStaysDead(t *testing.T) {
	addr := deadPort(t)
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatalf("a connection to %s was accepted", addr)
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v, want connection refused", addr, err)
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("a listener took %s", addr)
	}
}
