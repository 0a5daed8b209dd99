//go:build unix

package proxy

import (
	"io"
	"syscall"
)

// canPushSocket: push reads sockets with Unix read(2).
const canPushSocket = true

// pushSocket reads the rest of the body off the socket.
func (b *leanBody) pushSocket(raw syscall.RawConn, d *chunkDecoder, s byteSink) error {
	c := b.c
	var err error
	rerr := raw.Read(func(fd uintptr) bool {
		if c.inq == inqUntried {
			c.inq = enableInq(fd)
		}
		for {
			var p []byte
			if p, err = s.space(); err != nil {
				return true
			}
			m, waiting, errno := b.readFD(fd, p)
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
			if waiting == 0 {
				// The read emptied the socket and the backend has not
				// closed it: bytes or a close that come after the read
				// raise a new edge, so park without reading again. A
				// short read alone does not tell this: a close that came
				// in with the bytes read is left for a read of its own,
				// and raises no edge after it.
				return false
			}
			// More waits, or whether it does is not known: read on, to
			// EAGAIN (then park) or the end.
		}
	})
	if err == nil {
		err = rerr
	}
	return err
}
