//go:build unix

package upstream

import (
	"io"
	"syscall"
)

// canPushSocket: push reads sockets with Unix read(2).
const canPushSocket = true

// pushSocket reads the rest of the body off the socket.
func (b *leanBody) pushSocket(raw syscall.RawConn, d *chunkDecoder, s Sink) error {
	c := b.c
	// The callback is the connection's, made once: a closure made here
	// would be an allocation for every stream. Its state is the body's.
	b.sink, b.pushDec, b.pushErr = s, d, nil
	c.pushing = b
	rerr := raw.Read(c.pushFD)
	c.pushing, b.sink, b.pushDec = nil, nil, nil
	if err := b.pushErr; err != nil {
		return err
	}
	return rerr
}

// initPush makes c's callback for pushSocket.
func (c *leanConn) initPush() {
	c.pushFD = func(fd uintptr) bool { return c.pushing.pushFD(fd) }
}

// pushFD is pushSocket's callback: it reads the socket fd until it must
// wait for the next edge (false) or the body ended or failed (true, the
// error in b.pushErr).
func (b *leanBody) pushFD(fd uintptr) bool {
	c, s, d := b.c, b.sink, b.pushDec
	if c.inq == inqUntried {
		c.inq = enableInq(fd)
	}
	for {
		p, err := s.Space()
		if err != nil {
			b.pushErr = err
			return true
		}
		m, waiting, errno := b.readFD(fd, p)
		switch {
		case errno == syscall.EINTR:
			continue
		case errno == syscall.EAGAIN:
			return false // wait for the next edge
		case errno != 0:
			b.pushErr = errno
			return true
		case m == 0:
			b.pushErr = io.ErrUnexpectedEOF
			return true
		}
		n, used, derr := d.decode(p[:m])
		if err = took(s, n, m == len(p) || d.done(), derr); err != nil || d.done() {
			b.pushErr = err
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
}
