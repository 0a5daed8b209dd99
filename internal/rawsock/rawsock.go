//go:build unix

// Package rawsock reads and writes non-blocking sockets without the Go
// scheduler's system-call bookkeeping.
//
// A read or write of a net.Conn tells the scheduler it enters a system call
// (runtime.entersyscall). The first such call after every idle moment wakes
// the runtime's monitor thread (sysmon) from its sleep; it then polls every
// 20 µs, hands the processor to another thread when a call outlasts two of
// its ticks, and sleeps again once the process is idle. A proxy streaming
// many small events, idle between them, pays those wake-ups, thread switches
// and futex calls on every event: more CPU than the reads and writes
// themselves on a CPU of its own. A read or write of a non-blocking socket
// never blocks, so the scheduler has nothing to do about it: Conn makes the
// call with syscall.RawSyscall instead and waits for readiness in the
// poller as net.Conn does, under the same deadlines. The one cost: a call is
// not preempted, so a very large write (megabytes to loopback) holds its
// processor until the kernel has copied it.
package rawsock

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// Conn is a socket read and written without the scheduler's bookkeeping.
// Everything else is its net.Conn's. Safe for concurrent use as net.Conn is.
type Conn struct {
	net.Conn
	raw syscall.RawConn
}

// Wrap returns c as a Conn if it is a socket (it implements syscall.Conn),
// and c itself otherwise.
func Wrap(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &Conn{Conn: c, raw: raw}
}

// SyscallConn returns the socket's raw connection.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.raw, nil }

// Read reads as net.Conn's Read does: into p, waiting while there is
// nothing to read; io.EOF at the end.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n := 0
	var errno syscall.Errno
	err := c.raw.Read(func(fd uintptr) bool {
		for {
			m, e := ReadFD(fd, p)
			switch e {
			case 0:
				n = m
				return true
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false
			default:
				errno = e
				return true
			}
		}
	})
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case errno != 0:
		return 0, c.opError("read", os.NewSyscallError("read", errno))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes p whole as net.Conn's Write does, waiting for room.
func (c *Conn) Write(p []byte) (int, error) {
	n := 0
	var errno syscall.Errno
	err := c.raw.Write(func(fd uintptr) bool {
		for n < len(p) {
			m, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[n])), uintptr(len(p)-n))
			switch e {
			case 0:
				n += int(m)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false
			default:
				errno = e
				return true
			}
		}
		return true
	})
	switch {
	case err != nil:
		return n, c.opError("write", err)
	case errno != 0:
		return n, c.opError("write", os.NewSyscallError("write", errno))
	}
	return n, nil
}

// opError wraps err as net.Conn's errors are: a *net.OpError for op, so
// that callers which look at the operation (net/http does) see "read" or
// "write" and not the raw connection's "raw-read".
func (c *Conn) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		e := *oe
		e.Op = op
		return &e
	}
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// ReadFD reads the non-blocking socket fd into p, which is not empty, with
// syscall.RawSyscall: for a caller already inside a syscall.RawConn's Read.
func ReadFD(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if errno != 0 {
		return 0, errno
	}
	return int(n), 0
}
