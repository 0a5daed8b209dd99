package server

import (
	"net"
	"syscall"
	"unsafe"
)

// newErrorsConn wraps c; a socket's writes go through rawWrite.
func newErrorsConn(c net.Conn) errorsConn {
	ec := errorsConn{Conn: c}
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			ec.raw = raw
		}
	}
	return ec
}

// rawWrite writes p whole to the non-blocking socket behind raw, waiting
// for room in the poller as net.Conn's Write does (and so under the same
// write deadline), but makes the system call without telling the scheduler
// (syscall.RawSyscall). A write to a non-blocking socket never blocks, so
// the scheduler has nothing to do about it; told, it wakes its monitor
// thread (sysmon) from its sleep at the first call after every idle moment,
// which then polls every 20 µs, hands the processor to another thread when
// a write outlasts two of its ticks, and sleeps again: on a proxy streaming
// many small events, with the process idle between them, those wake-ups
// and thread switches cost more CPU than the writes.
func rawWrite(raw syscall.RawConn, p []byte) (int, error) {
	n := 0
	var errno syscall.Errno
	err := raw.Write(func(fd uintptr) bool {
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
	if err == nil && errno != 0 {
		err = errno
	}
	return n, err
}
