//go:build unix

package testfleet

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// A dead address refuses connections, and no listener is given its port
// or shares it while the test runs.
func TestDeadAddrStaysDead(t *testing.T) {
	addr := DeadAddr(t)
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
