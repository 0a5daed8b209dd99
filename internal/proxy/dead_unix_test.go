//go:build unix

package proxy

import (
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
)

// deadPort is a 127.0.0.1 address where nothing listens and nothing else
// can until the test ends: a socket bound there and never listening, made
// without SO_REUSEADDR (which every net.Listen sets), so that no listener
// shares the port nor is given it. A connection to it is refused.
func deadPort(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.CloseOnExec(fd)
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}

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
