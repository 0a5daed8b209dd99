package upstream

import (
	"syscall"
)

// A stream is pushed, not read, on the lean path. Go's poller is
// edge-triggered: a goroutine that calls Read parks only after a read that
// found nothing, so every event of a stream costs two reads of the backend's
// socket, the second answered EAGAIN. Push instead reads the socket inside
// one syscall.RawConn.Read for the whole body: a read that emptied the
// socket parks the goroutine at once, and the next edge (any bytes that
// arrive after that read, or the backend's close) wakes it. A read coming
// back short is not enough to know the socket empty: a close that came in
// with the bytes is left for the next read, and its edge is gone. On Linux
// the read (recvmsg with TCP_INQ) says what is left, the close included;
// elsewhere Push reads again, to EAGAIN. The events of each read are
// handed to a sink, which forwards them before the next read.

// Sink takes a body's bytes as they arrive. Its methods are called on the
// pushing goroutine, one at a time.
type Sink interface {
	// Space returns where the next bytes go: a non-empty free part of the
	// sink's buffer, or an error (the buffer may grow no more).
	Space() ([]byte, error)
	// Took says that the first n bytes of the last Space hold the body's
	// next bytes; more is set when more are already waiting, or when these
	// end the body: either way a flush now would only split what goes out
	// next (the response's end goes out when its handler returns). An error
	// stops the push and is returned by it.
	Took(n int, more bool) error
}

// Pusher is a response body that can push itself to a sink: the lean
// path's chunked bodies are, and a copy loop that finds one hands it its
// sink instead of reading it.
type Pusher interface {
	// Push hands the whole body to s. ok is false if the body cannot be
	// pushed (then nothing was read): read it. Else err is nil once the
	// body ended, or why it could not be read to its end, or the sink's
	// error.
	Push(s Sink) (ok bool, err error)
}

var _ Pusher = (*leanBody)(nil)

// The states of a connection's TCP_INQ (leanConn.inq).
const (
	inqUntried int8 = iota
	inqOn
	inqOff
)

// Push pushes a chunked body that has not been read from, off the
// connection's buffered reader first and then off its socket.
func (b *leanBody) Push(s Sink) (ok bool, err error) {
	if !b.chunked || b.read || b.c == nil {
		return false, nil
	}
	sc, isSys := b.c.nc.(syscall.Conn)
	if !isSys || !canPushSocket {
		return false, nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false, nil
	}
	b.read = true
	d := &b.dec // in the body: on its own it would be allocated, as pushSocket's callback takes it
	err = b.pushBuffered(d, s)
	if err == nil && !d.done() {
		err = b.pushSocket(raw, d, s)
	}
	if err == nil {
		err = b.endChunked(d)
	}
	b.eof = err == nil
	b.release(b.eof)
	return true, err
}

// pushBuffered pushes what the connection's reader holds already: the bytes
// read with the response's headers.
func (b *leanBody) pushBuffered(d *chunkDecoder, s Sink) error {
	br := b.c.br
	for br.Buffered() > 0 && !d.done() {
		p, err := s.Space()
		if err != nil {
			return err
		}
		in, _ := br.Peek(min(br.Buffered(), len(p)))
		k := copy(p, in)
		_, _ = br.Discard(k)
		n, used, err := d.decode(p[:k])
		if used < k {
			b.keep = false // bytes after the body: not a connection to reuse
		}
		if err := took(s, n, br.Buffered() > 0 || d.done(), err); err != nil {
			return err
		}
	}
	if br.Buffered() > 0 {
		b.keep = false
	}
	return nil
}

// took hands s the n bytes decoded, those before the decoder's error derr
// too, and returns the first error.
func took(s Sink, n int, more bool, derr error) error {
	if n > 0 {
		if err := s.Took(n, more && derr == nil); err != nil {
			return err
		}
	}
	return derr
}

// endChunked fills the response's trailers from a body that has ended.
func (b *leanBody) endChunked(d *chunkDecoder) error {
	tr, err := d.trailers()
	if err != nil {
		return err
	}
	if tr == nil {
		return nil
	}
	if b.res.Trailer == nil {
		b.res.Trailer = tr
		return nil
	}
	for k, vv := range tr {
		b.res.Trailer[k] = vv
	}
	return nil
}
