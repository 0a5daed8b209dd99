package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/textproto"
)

// chunkDecoder decodes an HTTP/1.1 chunked body (RFC 9112 section 7.1) a
// read at a time, in place: the lean path's push reads the backend's socket
// straight into the event buffer and strips the chunk framing there, so no
// byte is copied twice and no read waits on a reader layered over another.
// Its state carries over between reads, so a size line, the CRLF after a
// chunk's data or the trailer section may be split anywhere. It is as strict
// as net/http's reader: size lines end in CRLF (no bare LF, no stray CR),
// extensions are skipped, a line is at most maxChunkLine bytes and a size at
// most 15 hex digits.
type chunkDecoder struct {
	state chunkState
	// left is the chunk's size while its line is read, then the data
	// bytes still to come.
	left   int64
	digits int // hex digits of the size line so far
	line   int // bytes of the current size or trailer line so far
	// trailer is the trailer section without its final empty line.
	trailer []byte
}

type chunkState uint8

const (
	chunkSize    chunkState = iota // the size's hex digits
	chunkSizeEnd                   // whitespace after the size, before ';' or CR
	chunkExt                       // an extension, skipped up to CR
	chunkSizeLF                    // the LF that ends the size line
	chunkData                      // the chunk's data
	chunkDataCR                    // the CRLF after the data
	chunkDataLF
	chunkTrailer   // the trailer section, at a line's start when line is 0
	chunkTrailerLF // the LF of the empty line that ends the body
	chunkDone      // the body has ended
)

// Limits: net/http's for a chunk line; the trailers, which net/http bounds
// by its reader's buffer (4 KiB), get more room.
const (
	maxChunkLine    = 4096
	maxTrailerBytes = 16 << 10
)

var (
	errChunkMalformed = errors.New("malformed chunked encoding")
	errChunkLine      = errors.New("chunked encoding: line too long")
	errChunkSize      = errors.New("chunked encoding: chunk size too large")
	errTrailerLong    = errors.New("chunked encoding: trailer section too long")
)

// decode turns p, the next bytes of the body as they came, into the body's
// data: on return p[:n] holds the data it carried, in order. used is how
// many bytes of p belonged to the body; once the body has ended (done), the
// rest of p came after it. A malformed body is an error, after which the
// decoder must not be used again.
func (d *chunkDecoder) decode(p []byte) (n, used int, err error) {
	i := 0
	for i < len(p) && d.state != chunkDone {
		if d.state == chunkData {
			k := int(min(int64(len(p)-i), d.left))
			n += copy(p[n:], p[i:i+k])
			i += k
			if d.left -= int64(k); d.left == 0 {
				d.state = chunkDataCR
			}
			continue
		}
		if err := d.step(p[i]); err != nil {
			return n, i, err
		}
		i++
	}
	return n, i, nil
}

// done reports whether the body has ended.
func (d *chunkDecoder) done() bool { return d.state == chunkDone }

// step takes one byte of framing: a size line, a chunk's CRLF, the trailers.
func (d *chunkDecoder) step(c byte) error {
	switch d.state {
	case chunkSize:
		if h := unhex(c); h >= 0 {
			if d.digits == 15 {
				return errChunkSize
			}
			d.left = d.left<<4 | int64(h)
			d.digits++
			return d.count()
		}
		if d.digits == 0 {
			return errChunkMalformed
		}
		d.state = chunkSizeEnd
		return d.step(c)
	case chunkSizeEnd, chunkExt:
		switch {
		case c == '\r':
			d.state = chunkSizeLF
		case c == '\n':
			return errChunkMalformed // a bare LF
		case d.state == chunkSizeEnd && c == ';':
			d.state = chunkExt
		case d.state == chunkSizeEnd && c != ' ' && c != '\t':
			return errChunkMalformed
		}
		return d.count()
	case chunkSizeLF:
		if c != '\n' {
			return errChunkMalformed
		}
		d.state, d.line, d.digits = chunkData, 0, 0
		if d.left == 0 {
			d.state = chunkTrailer // the last chunk
		}
	case chunkDataCR:
		if c != '\r' {
			return errChunkMalformed
		}
		d.state = chunkDataLF
	case chunkDataLF:
		if c != '\n' {
			return errChunkMalformed
		}
		d.state = chunkSize
	case chunkTrailer:
		return d.trailerByte(c)
	case chunkTrailerLF:
		if c != '\n' {
			return errChunkMalformed
		}
		d.state = chunkDone
	}
	return nil
}

// count counts a byte of the size line against its limit.
func (d *chunkDecoder) count() error {
	if d.line++; d.line >= maxChunkLine {
		return errChunkLine
	}
	return nil
}

// trailerByte takes a byte of the trailer section; an empty line ends it.
func (d *chunkDecoder) trailerByte(c byte) error {
	if d.line == 0 {
		switch c {
		case '\r':
			d.state = chunkTrailerLF
			return nil
		case '\n':
			d.state = chunkDone
			return nil
		}
	}
	if len(d.trailer) >= maxTrailerBytes {
		return errTrailerLong
	}
	d.trailer = append(d.trailer, c)
	d.line++
	if c == '\n' {
		d.line = 0
	}
	return nil
}

// trailers parses the trailer section of a body that has ended; nil if it
// had none.
func (d *chunkDecoder) trailers() (http.Header, error) {
	if len(d.trailer) == 0 {
		return nil, nil
	}
	r := textproto.NewReader(bufio.NewReader(io.MultiReader(bytes.NewReader(d.trailer), bytes.NewReader([]byte("\r\n")))))
	h, err := r.ReadMIMEHeader()
	if err != nil {
		return nil, errors.Join(errChunkMalformed, err)
	}
	return http.Header(h), nil
}

// unhex is the value of the hex digit c, or -1.
func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}
