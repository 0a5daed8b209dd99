//go:build !unix

package rawsock

import "net"

// Wrap returns c: raw system calls are for Unix sockets only.
func Wrap(c net.Conn) net.Conn { return c }
