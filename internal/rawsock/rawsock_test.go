//go:build unix

package rawsock

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// socketPair returns the accepted side of a loopback connection, wrapped,
// and the dialled side.
func socketPair(t *testing.T) (*Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc, ok := Wrap(c).(*Conn)
	if !ok {
		t.Fatal("a TCP connection is not wrapped")
	}
	return rc, peer
}

func TestWrapLeavesOtherConnsAlone(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if Wrap(a) != a {
		t.Error("a pipe was wrapped")
	}
}

// A write larger than the socket's buffers waits in the poller for room and
// goes out whole; reads bring it back in order, then io.EOF.
func TestWriteWaitsForRoomAndReadsItBack(t *testing.T) {
	rc, peer := socketPair(t)
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<19) // 8 MiB
	got := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(peer)
		got <- b
	}()
	n, err := rc.Write(want)
	if err != nil || n != len(want) {
		t.Fatalf("wrote %d of %d bytes: %v", n, len(want), err)
	}
	rc.Close()
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the peer read %d bytes, not what was written", len(b))
	}

	rc, peer = socketPair(t)
	go func() {
		_, _ = peer.Write(want)
		peer.Close()
	}()
	b, err := io.ReadAll(rc)
	if err != nil || !bytes.Equal(b, want) {
		t.Fatalf("read %d bytes (%v), not what the peer wrote", len(b), err)
	}
}

// Waiting ends at the deadline, with net.Conn's error: a timeout, from the
// operation named as net.Conn names it.
func TestDeadlines(t *testing.T) {
	rc, _ := socketPair(t) // the peer reads and writes nothing
	if err := rc.SetDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	n, err := rc.Write(make([]byte, 64<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write: err %v, want the deadline", err)
	}
	// How much was written depends on when the test got a CPU: all of it
	// is impossible, since the peer reads nothing.
	if n < 0 || n >= 64<<20 {
		t.Errorf("wrote %d bytes before the deadline, want fewer than all", n)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "write" || !oe.Timeout() {
		t.Errorf("write: err %#v, want a *net.OpError for write that is a timeout", err)
	}
	_, err = rc.Read(make([]byte, 10))
	if !errors.As(err, &oe) || oe.Op != "read" || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("read: err %v, want a *net.OpError for read past the deadline", err)
	}
}

// Writes to a connection its peer closed, or closed here, fail; none hangs.
func TestClosed(t *testing.T) {
	rc, peer := socketPair(t)
	peer.Close()
	_ = rc.SetWriteDeadline(time.Now().Add(10 * time.Second)) // a hang fails the test, not the run
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = rc.Write(make([]byte, 4096))
	}
	var oe *net.OpError
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &oe) || oe.Op != "write" {
		t.Fatalf("writes to a closed peer: err %v", err)
	}
	rc.Close()
	if _, err := rc.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("write after Close: err %v, want net.ErrClosed", err)
	}
	if _, err := rc.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("read after Close: err %v, want net.ErrClosed", err)
	}
}

// A read waiting for data ends when another goroutine closes the
// connection, as the proxy ends a request whose client went away.
func TestCloseUnblocksRead(t *testing.T) {
	rc, _ := socketPair(t)
	done := make(chan error)
	go func() {
		_, err := rc.Read(make([]byte, 1))
		done <- err
	}()
	rc.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("err %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the read did not end")
	}
}

// A read or a write allocates nothing: a proxy makes one of each per
// streamed event, and every allocation there is work for the garbage
// collector, whose cycles then charge the streams' goroutines (mark
// assists) and come sooner.
func TestReadAndWriteAllocateNothing(t *testing.T) {
	rc, peer := socketPair(t)
	wc := Wrap(peer).(*Conn)
	out, in := []byte("data: {\"choices\":[]}\n\n"), make([]byte, 64)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := wc.Write(out); err != nil {
			t.Fatal(err)
		}
		if n, err := io.ReadFull(rc, in[:len(out)]); err != nil || n != len(out) {
			t.Fatal(n, err)
		}
	})
	if allocs != 0 {
		t.Errorf("a write and a read allocate %v times, want none", allocs)
	}
}
