package upstream

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// A backend that sends its last bytes and closes the connection at once
// gets both to the proxy's socket before the push reads them. The read then
// returns the bytes, short of the buffer, and the close is left for a read
// that returns 0; no new readiness comes for it (Go's poller is
// edge-triggered, and the close's edge came with the bytes'). A push that
// took a short read for an empty socket waited there until the idle timeout
// (60 s), as TestPushedStreamBreaksOff did now and then on a loaded machine.
// Here the sink holds the push until the close is in the socket, so that
// the order is certain: the push must end with the connection's end. The
// socket cases hung every time when a short read parked the push; the
// buffered ones only when Go's poller took the edge before the push's
// read began (else the edge wakes it), which is a matter of timing.
func TestPushSeesCloseBehindLastBytes(t *testing.T) {
	for _, tt := range []struct {
		name string
		// first goes with the headers (read with them, pushed from the
		// buffer; the socket's read comes after the close) or after them
		// (pushed off the socket; the close comes while the push is in it).
		withHead bool
		raw      bool
		// noInq reads as where TCP_INQ is not: to EAGAIN.
		noInq bool
		// tail is the last bytes sent, the start of a chunk; pushed what
		// the sink gets of them.
		tail, pushed string
	}{
		{name: "buffered/raw", withHead: true, raw: true, tail: "4"},
		{name: "buffered/netconn", withHead: true, raw: false, tail: "4"},
		{name: "socket/raw", raw: true, tail: "4"},
		{name: "socket/netconn", raw: false, tail: "4"},
		{name: "socket/mid-chunk", raw: true, tail: "40\r\ndata: {", pushed: "data: {"},
		{name: "buffered/no TCP_INQ", withHead: true, raw: true, noInq: true, tail: "4"},
		{name: "socket/no TCP_INQ", raw: true, noInq: true, tail: "4"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			first, tail := make(chan struct{}), make(chan struct{})
			served := make(chan error, 1)
			go func() { served <- serveThenClose(ln, tt.withHead, first, tail, tt.tail) }()

			lt := NewLean(NewTransport(), tt.raw)
			defer lt.CloseIdleConnections()
			// The test's own bound on a hang: ends the request, and with it the
			// push, if the push does not end by itself.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+ln.Addr().String()+"/v1/chat/completions", strings.NewReader(streamBody))
			res, err := lt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			body := res.Body.(*leanBody)
			fd := connFD(t, body.c.nc)
			if tt.noInq {
				body.c.inq = inqOff
			}
			close(first)
			s := &holdSink{at: evHi, hold: func() {
				close(tail)
				if err := <-served; err != nil {
					t.Error(err)
				}
				waitPeerClosed(t, fd)
			}}
			ok, err := body.Push(s)
			if !ok {
				t.Fatal("the body did not push itself")
			}
			if ctx.Err() != nil {
				t.Fatalf("the push ended only with the request's context (%v): it missed the backend's close", err)
			}
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("push: %v, want %v", err, io.ErrUnexpectedEOF)
			}
			if string(s.got) != evHi+tt.pushed {
				t.Errorf("pushed %q", s.got)
			}
		})
	}
}

// serveThenClose answers one request with a chunked stream's headers and
// one event (with the headers, or once first is closed), then, once tail is
// closed, writes last and closes the connection.
func serveThenClose(ln net.Listener, withHead bool, first, tail <-chan struct{}, last string) error {
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, req.Body)
	if withHead {
		_, err = io.WriteString(c, rawHead+chunk(evHi))
	} else if _, err = io.WriteString(c, rawHead); err == nil {
		<-first
		_, err = io.WriteString(c, chunk(evHi))
	}
	if err != nil {
		return err
	}
	<-tail
	_, err = io.WriteString(c, last)
	return err
}

// holdSink keeps what is pushed to it, and calls hold once it holds at.
type holdSink struct {
	buf  [256]byte
	got  []byte
	at   string
	hold func()
}

func (s *holdSink) Space() ([]byte, error) { return s.buf[:], nil }

func (s *holdSink) Took(n int, more bool) error {
	s.got = append(s.got, s.buf[:n]...)
	if s.hold != nil && string(s.got) == s.at {
		s.hold()
		s.hold = nil
	}
	return nil
}

// connFD is the socket of nc, a TCP connection or a rawsock one around it.
func connFD(t *testing.T, nc net.Conn) uintptr {
	t.Helper()
	raw, err := nc.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd uintptr
	if err := raw.Control(func(f uintptr) { fd = f }); err != nil {
		t.Fatal(err)
	}
	return fd
}

// waitPeerClosed waits until the socket fd has the peer's FIN, without
// reading it.
func waitPeerClosed(t *testing.T, fd uintptr) {
	t.Helper()
	const pollRDHUP = 0x2000
	waitPoll(t, fd, pollRDHUP)
}

// waitPoll waits with ppoll(2) until the socket fd has one of events.
func waitPoll(t *testing.T, fd uintptr, events int16) {
	t.Helper()
	pfd := struct {
		fd             int32
		events, revent int16
	}{fd: int32(fd), events: events}
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, 0, 0, 0, 0)
		switch e {
		case 0:
			return
		case syscall.EINTR:
		default:
			t.Fatalf("ppoll: %v", e)
		}
	}
}

// A read with TCP_INQ says what the socket holds after it: 0 when nothing,
// more than 0 while bytes or the peer's close wait.
func TestReadFDWaiting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	fd := connFD(t, client)
	b := &leanBody{t: &Lean{raw: true}, c: &leanConn{nc: client}}
	if b.c.inq = enableInq(fd); b.c.inq != inqOn {
		t.Skip("no TCP_INQ in this kernel")
	}
	p := make([]byte, 64)
	read := func(want string, wantWaiting int) {
		t.Helper()
		var n, waiting int
		var errno syscall.Errno
		err := rawRead(t, client, func(fd uintptr) bool {
			n, waiting, errno = b.readFD(fd, p)
			return errno != syscall.EAGAIN
		})
		if err != nil || errno != 0 || string(p[:n]) != want || waiting != wantWaiting {
			t.Fatalf("read %q, waiting %d (%v, %v); want %q, waiting %d", p[:n], waiting, err, errno, want, wantWaiting)
		}
	}
	io.WriteString(peer, "abc")
	read("abc", 0)
	io.WriteString(peer, "defgh")
	waitSocketHolds(t, fd, 5)
	p = p[:2]
	read("de", 3)
	p = p[:64]
	io.WriteString(peer, "ij")
	peer.Close()
	waitPeerClosed(t, fd)
	read("fghij", 1) // the close
	read("", 1)
}

// rawRead runs f in nc's raw connection's Read.
func rawRead(t *testing.T, nc net.Conn, f func(uintptr) bool) error {
	t.Helper()
	raw, err := nc.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return raw.Read(f)
}

// waitSocketHolds waits until the socket fd has bytes to read, and checks
// that they are n.
func waitSocketHolds(t *testing.T, fd uintptr, n int) {
	t.Helper()
	const pollIN = 0x1
	waitPoll(t, fd, pollIN)
	var got int32
	const fionread = 0x541b // FIONREAD, SIOCINQ
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, fionread, uintptr(unsafe.Pointer(&got))); e != 0 {
		t.Fatalf("ioctl FIONREAD: %v", e)
	}
	if int(got) != n {
		t.Fatalf("the socket holds %d bytes, want %d", got, n)
	}
}
