//go:build unix

package testfleet

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// DeadAddr returns a 127.0.0.1 address where nothing listens and nothing
// else can until the test ends: a socket bound there and never listening,
// made without SO_REUSEADDR (which every net.Listen sets), so that no
// listener shares the port nor is given it. A connection to it is refused.
// A closed listener's port would not do: the kernel may hand it to the
// next listener, a test's own proxy or emulator, and the "dead" backend
// answers.
func DeadAddr(t testing.TB) string {
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
