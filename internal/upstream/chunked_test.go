package upstream

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"reflect"
	"strings"
	"testing"
)

// decodeSplit decodes body fed to the decoder in pieces of at most size
// bytes, as reads would bring them. It returns the data, the bytes after
// the body's end, and whether the body ended.
func decodeSplit(d *chunkDecoder, body []byte, size int) (data, after []byte, done bool, err error) {
	for off := 0; off < len(body); off += size {
		p := append([]byte(nil), body[off:min(off+size, len(body))]...)
		n, used, err := d.decode(p)
		data = append(data, p[:n]...)
		if err != nil {
			return data, nil, false, err
		}
		if d.done() {
			return data, append(p[used:], body[min(off+size, len(body)):]...), true, nil
		}
	}
	return data, nil, d.done(), nil
}

func TestChunkDecoderSplitsAnywhere(t *testing.T) {
	tests := []struct {
		name, body, want, after string
		trailer                 http.Header
	}{
		{name: "events", body: "5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n", want: "hello, world"},
		{name: "upper hex and padding", body: "00A\r\n0123456789\r\n0\r\n\r\n", want: "0123456789"},
		{name: "extensions", body: "3;name=value\r\nabc\r\n2 ; x\r\nde\r\n0;last\r\n\r\n", want: "abcde"},
		{name: "whitespace before CR", body: "3 \t\r\nabc\r\n0\r\n\r\n", want: "abc"},
		{name: "data with CRLF inside", body: "4\r\n\r\n\r\n\r\n0\r\n\r\n", want: "\r\n\r\n"},
		{name: "trailers", body: "1\r\nx\r\n0\r\nX-Ttft: 12\r\nX-Other: a b\r\n\r\n", want: "x",
			trailer: http.Header{"X-Ttft": {"12"}, "X-Other": {"a b"}}},
		{name: "bytes after the end", body: "1\r\nx\r\n0\r\n\r\nHTTP/1.1", want: "x", after: "HTTP/1.1"},
		{name: "empty body", body: "0\r\n\r\n", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for size := 1; size <= len(tt.body); size++ {
				var d chunkDecoder
				data, after, done, err := decodeSplit(&d, []byte(tt.body), size)
				if err != nil || !done {
					t.Fatalf("pieces of %d: done %v, err %v", size, done, err)
				}
				if string(data) != tt.want || string(after) != tt.after {
					t.Fatalf("pieces of %d: data %q after %q, want %q and %q", size, data, after, tt.want, tt.after)
				}
				tr, err := d.trailers()
				if err != nil || !reflect.DeepEqual(tr, tt.trailer) {
					t.Fatalf("pieces of %d: trailers %v (%v), want %v", size, tr, err, tt.trailer)
				}
			}
		})
	}
}

func TestChunkDecoderRejectsMalformed(t *testing.T) {
	tests := []struct {
		name, body string
		wantErr    error
	}{
		{name: "no digits", body: "\r\n", wantErr: errChunkMalformed},
		{name: "not hex", body: "g\r\n", wantErr: errChunkMalformed},
		{name: "space before the size", body: " 1\r\nx\r\n", wantErr: errChunkMalformed},
		{name: "junk after the size", body: "1 x\r\nx\r\n", wantErr: errChunkMalformed},
		{name: "bare LF", body: "1\nx\r\n", wantErr: errChunkMalformed},
		{name: "CR inside the line", body: "1;a\rb\r\nx\r\n", wantErr: errChunkMalformed},
		{name: "no CRLF after the data", body: "1\r\nxy\r\n", wantErr: errChunkMalformed},
		{name: "LF alone after the data", body: "1\r\nx\n0\r\n\r\n", wantErr: errChunkMalformed},
		{name: "size overflow", body: "1000000000000000\r\n", wantErr: errChunkSize},
		{name: "long extension", body: "1;" + strings.Repeat("e", maxChunkLine) + "\r\n", wantErr: errChunkLine},
		{name: "long trailers", body: "0\r\nX: " + strings.Repeat("v", maxTrailerBytes) + "\r\n\r\n", wantErr: errTrailerLong},
		{name: "CR without LF at the end", body: "0\r\n\rx", wantErr: errChunkMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, size := range []int{1, 3, len(tt.body)} {
				var d chunkDecoder
				_, _, _, err := decodeSplit(&d, []byte(tt.body), size)
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("pieces of %d: err %v, want %v", size, err, tt.wantErr)
				}
			}
		})
	}
}

func TestChunkDecoderMalformedTrailer(t *testing.T) {
	var d chunkDecoder
	_, _, done, err := decodeSplit(&d, []byte("0\r\nno colon here\r\n\r\n"), 4)
	if err != nil || !done {
		t.Fatalf("done %v err %v", done, err)
	}
	if _, err := d.trailers(); !errors.Is(err, errChunkMalformed) {
		t.Fatalf("trailers: err %v, want errChunkMalformed", err)
	}
}

// FuzzChunkDecoder checks the decoder against net/http's chunked reader:
// on a body both accept they give the same data, and the decoder never
// accepts more data than net/http would give.
func FuzzChunkDecoder(f *testing.F) {
	f.Add([]byte("5\r\nhello\r\n0\r\n\r\n"), uint8(3))
	f.Add([]byte("3;x=y\r\nabc\r\n0\r\nA: b\r\n\r\n"), uint8(1))
	f.Add([]byte("a\r\n0123456789\r\n"), uint8(7))
	f.Fuzz(func(t *testing.T, body []byte, size uint8) {
		var d chunkDecoder
		data, _, done, err := decodeSplit(&d, body, int(size)+1)
		want, stdErr := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(body)))
		if err == nil && done && stdErr == nil && !bytes.Equal(data, want) {
			t.Fatalf("data %q, net/http %q", data, want)
		}
		if !bytes.HasPrefix(want, data) && !bytes.HasPrefix(data, want) {
			t.Fatalf("data %q and net/http's %q differ", data, want)
		}
	})
}
