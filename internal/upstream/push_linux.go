package upstream

import (
	"syscall"
	"unsafe"

	"github.com/kvroute/kvroute/internal/rawsock"
)

// tcpInq is TCP_INQ (Linux 4.18), and TCP_CM_INQ, its control message's
// type: a read made with recvmsg also returns how many bytes the socket
// still holds, 1 when none but the backend has closed it.
const tcpInq = 36

// enableInq turns TCP_INQ on for the socket fd: inqOn, or inqOff where the
// kernel does not have it.
func enableInq(fd uintptr) int8 {
	one := int32(1)
	_, _, e := syscall.RawSyscall6(syscall.SYS_SETSOCKOPT, fd, syscall.SOL_TCP, tcpInq, uintptr(unsafe.Pointer(&one)), 4, 0)
	if e != 0 {
		return inqOff
	}
	return inqOn
}

// readFD reads the socket fd into p, which is not empty, with a raw system
// call unless the transport says otherwise. waiting is what the socket
// holds after the read, bytes or the backend's close (TCP_INQ): 0 when
// nothing, -1 when not known.
func (b *leanBody) readFD(fd uintptr, p []byte) (n, waiting int, errno syscall.Errno) {
	if b.c.inq != inqOn {
		n, errno = b.readPlain(fd, p)
		return n, -1, errno
	}
	iov := syscall.Iovec{Base: &p[0]}
	iov.SetLen(len(p))
	var ctl [4]uint64 // a control message of one int32, aligned
	msg := syscall.Msghdr{Iov: &iov, Iovlen: 1, Control: (*byte)(unsafe.Pointer(&ctl[0]))}
	msg.SetControllen(int(unsafe.Sizeof(ctl)))
	var r uintptr
	if b.t.raw {
		r, _, errno = syscall.RawSyscall(syscall.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&msg)), 0)
	} else {
		r, _, errno = syscall.Syscall(syscall.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&msg)), 0)
	}
	if errno != 0 {
		return 0, -1, errno
	}
	waiting = -1
	h := (*syscall.Cmsghdr)(unsafe.Pointer(&ctl[0]))
	if int(msg.Controllen) >= syscall.SizeofCmsghdr+4 && h.Level == syscall.SOL_TCP && h.Type == tcpInq {
		waiting = int(*(*int32)(unsafe.Pointer(uintptr(unsafe.Pointer(&ctl[0])) + syscall.SizeofCmsghdr)))
	}
	return int(r), waiting, 0
}

// readPlain reads the socket fd into p with read(2).
func (b *leanBody) readPlain(fd uintptr, p []byte) (int, syscall.Errno) {
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
