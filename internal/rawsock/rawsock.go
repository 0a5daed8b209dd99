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
	"sync"
	"syscall"
	"unsafe"
)

// Conn is a socket read and written without the scheduler's bookkeeping.
// Everything else is its net.Conn's. Safe for concurrent use as net.Conn is.
type Conn struct {
	net.Conn
	raw syscall.RawConn
	// rd and wr carry a read's and a write's buffer and results to and
	// from the callback RawConn runs, made once per connection: a closure
	// over the call's locals escapes through RawConn's interface, and took
	// two allocations per call, one call per streamed event.
	rd, wr op
}

// op is one direction's call: its buffer, what the callback did with it,
// and the callback. mu makes it one call at a time, as the socket's own
// read or write lock inside RawConn would.
type op struct {
	mu    sync.Mutex
	p     []byte
	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool
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
	rc := &Conn{Conn: c, raw: raw}
	rc.rd.fn, rc.wr.fn = rc.rd.read, rc.wr.write
	return rc
}

// SyscallConn returns the socket's raw connection.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.raw, nil }

// Read reads as net.Conn's Read does: into p, waiting while there is
// nothing to read; io.EOF at the end.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, errno, err := c.rd.call(c.raw.Read, p)
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
	n, errno, err := c.wr.call(c.raw.Write, p)
	switch {
	case err != nil:
		return n, c.opError("write", err)
	case errno != 0:
		return n, c.opError("write", os.NewSyscallError("write", errno))
	}
	return n, nil
}

// call runs o's callback on p through run (the raw connection's Read or
// Write) and returns what it did.
func (o *op) call(run func(func(uintptr) bool) error, p []byte) (int, syscall.Errno, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.p, o.n, o.errno = p, 0, 0
	err := run(o.fn)
	o.p = nil // the caller's buffer is not ours to keep
	return o.n, o.errno, err
}

// read is the read's callback: one read of the socket into p; false (wait
// in the poller) when there is nothing to read.
func (o *op) read(fd uintptr) bool {
	for {
		m, e := ReadFD(fd, o.p)
		switch e {
		case 0:
			o.n = m
			return true
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			o.errno = e
			return true
		}
	}
}

// write is the write's callback: writes of p until it is all out; false
// (wait in the poller) when the socket has no room for the rest.
func (o *op) write(fd uintptr) bool {
	for o.n < len(o.p) {
		m, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&o.p[o.n])), uintptr(len(o.p)-o.n))
		switch e {
		case 0:
			o.n += int(m)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			o.errno = e
			return true
		}
	}
	return true
}

// opError wraps err as net.Conn's errors are: a *net.OpError for op, so
// that callers which look at the operation (net/http does) see "read" or
// "write" and not the raw connection's "raw-read".
func (c *Conn) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		oe.Op = op // the raw connection made it for this call alone
		return oe
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
