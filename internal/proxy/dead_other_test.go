//go:build !unix

package proxy

import (
	"net"
	"testing"
)

// deadPort is a 127.0.0.1 address where nothing listens: a listener's,
// closed. Unlike the Unix one, the port may be handed to a later listener.
func deadPort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	return ln.Addr().String()
}
