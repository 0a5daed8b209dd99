package server

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// socketPair returns the accepted side of a loopback connection, wrapped as
// the server wraps it, and the dialled side.
func socketPair(t *testing.T) (errorsConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ec := newErrorsConn(c)
	if ec.raw == nil {
		t.Fatal("a TCP connection is not written raw")
	}
	return ec, client
}

// A write larger than the socket's buffers waits in the poller for room and
// goes out whole.
func TestRawWriteWaitsForRoom(t *testing.T) {
	ec, client := socketPair(t)
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<19) // 8 MiB
	got := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(client)
		got <- b
	}()
	n, err := ec.Write(want)
	if err != nil || n != len(want) {
		t.Fatalf("wrote %d of %d bytes: %v", n, len(want), err)
	}
	ec.Close()
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("read %d bytes, not what was written", len(b))
	}
}

// A write waiting for room ends at the write deadline, as net.Conn's does.
func TestRawWriteDeadline(t *testing.T) {
	ec, _ := socketPair(t) // the client reads nothing
	if err := ec.SetWriteDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	n, err := ec.Write(make([]byte, 64<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("err %v, want the deadline", err)
	}
	if n <= 0 || n >= 64<<20 {
		t.Errorf("wrote %d bytes before the deadline, want some", n)
	}
	if _, err := ec.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("write past the deadline: err %v", err)
	}
}

// Writes to a connection its peer closed, or closed here, fail; none hangs.
func TestRawWriteClosed(t *testing.T) {
	ec, client := socketPair(t)
	client.Close()
	_ = ec.SetWriteDeadline(time.Now().Add(10 * time.Second)) // a hang fails the test, not the run
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = ec.Write(make([]byte, 4096))
	}
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("writes to a closed peer: err %v", err)
	}
	ec.Close()
	if _, err := ec.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("write after Close: err %v, want net.ErrClosed", err)
	}
}
