//go:build unix && !linux

package upstream

import (
	"syscall"

	"github.com/kvroute/kvroute/internal/rawsock"
)

// enableInq: only Linux tells a read what the socket still holds.
func enableInq(uintptr) int8 { return inqOff }

// readFD reads the socket fd into p, which is not empty, with a raw system
// call unless the transport says otherwise. waiting is -1: what the socket
// holds after the read is not known.
func (b *leanBody) readFD(fd uintptr, p []byte) (n, waiting int, errno syscall.Errno) {
	if b.t.raw {
		n, errno = rawsock.ReadFD(fd, p)
		return n, -1, errno
	}
	n, err := syscall.Read(int(fd), p)
	if e, ok := err.(syscall.Errno); ok {
		return 0, -1, e
	} else if err != nil {
		return 0, -1, syscall.EIO
	}
	return n, -1, 0
}
