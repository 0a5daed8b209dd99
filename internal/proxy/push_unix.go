//go:build unix

package proxy

import (
	"io"
	"syscall"

	"github.com/kvroute/kvroute/internal/rawsock"
)

// canPushSocket: push reads sockets with Unix read(2).
const canPushSocket = true

// pushSocket reads the rest of the body off the socket.
func (b *leanBody) pushSocket(raw syscall.RawConn, d *chunkDecoder, s byteSink) error {
	var err error
	rerr := raw.Read(func(fd uintptr) bool {
		for {
			var p []byte
			if p, err = s.space(); err != nil {
				return true
			}
			m, errno := b.readFD(fd, p)
			switch {
			case errno == syscall.EINTR:
				continue
			case errno == syscall.EAGAIN:
				return false // wait for the next edge
			case errno != 0:
				err = errno
				return true
			case m == 0:
				err = io.ErrUnexpectedEOF
				return true
			}
			n, used, derr := d.decode(p[:m])
			if err = took(s, n, m == len(p), derr); err != nil || d.done() {
				if used < m {
					b.keep = false // bytes after the body: not a connection to reuse
				}
				return true
			}
			if m < len(p) {
				// The read emptied the socket: bytes that come after it
				// raise a new edge, so park without reading again.
				return false
			}
		}
	})
	if err == nil {
		err = rerr
	}
	return err
}

// readFD reads the socket fd into p, with a raw system call unless the
// transport says otherwise.
func (b *leanBody) readFD(fd uintptr, p []byte) (int, syscall.Errno) {
	if b.t.raw {
		return rawsock.ReadFD(fd, p)
	}
	n, err := syscall.Read(int(fd), p)
	if errno, ok := err.(syscall.Errno); ok {
		return 0, errno
	} else if err != nil {
		return 0, syscall.EIO
	}
	return n, 0
}
