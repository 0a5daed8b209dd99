package proxy

import (
	"bytes"
	"io"
	"net/http/httptest"
	"testing"
)

// The fuzz targets' seed corpora are under testdata/fuzz/<target>/; CI runs
// each target for a few seconds (.ci/run).

// chunkReader returns its bytes at most n at a time, as a backend's stream
// arrives in pieces.
type chunkReader struct {
	b []byte
	n int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	k := min(len(p), r.n, len(r.b))
	copy(p, r.b[:k])
	r.b = r.b[k:]
	return k, nil
}

// FuzzEventStream feeds event streams through copyEvents in pieces of any
// size. It must not panic; what comes out must not depend on how the
// stream was cut into reads; without hideUsage the stream passes
// byte-for-byte; with it, the only edits are dropped usage-only events and
// cut `"usage":null` members, so a stream without "usage" passes as is.
func FuzzEventStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\ndata: [DONE]\n\n"), true, uint8(3))
	f.Add([]byte(": keep-alive\r\n\r\nevent: x\ndata: {}\n\n"), false, uint8(0))
	f.Fuzz(func(t *testing.T, stream []byte, hideUsage bool, piece uint8) {
		_, _ = parseUsage(stream) // any bytes, not only an event's
		_ = hasContent(stream)
		run := func(n int) (string, eventScanner) {
			rec := httptest.NewRecorder()
			sc := eventScanner{hideUsage: hideUsage}
			firsts := 0
			readErr, writeErr := copyEvents(rec, &chunkReader{b: stream, n: n}, &sc, func() { firsts++ })
			if readErr != nil || writeErr != nil {
				t.Fatalf("copyEvents: %v, %v", readErr, writeErr)
			}
			if firsts > 1 || (firsts == 1) != (sc.tokens > 0) {
				t.Fatalf("onFirst called %d times for %d content chunks", firsts, sc.tokens)
			}
			return rec.Body.String(), sc
		}
		whole, sc1 := run(len(stream) + 1)
		cut, sc2 := run(int(piece) + 1)
		if whole != cut || sc1 != sc2 {
			t.Fatalf("reads of %d bytes gave %q %+v, one read %q %+v", piece+1, cut, sc2, whole, sc1)
		}
		if len(whole) > len(stream) {
			t.Fatalf("output %q longer than input %q", whole, stream)
		}
		if (!hideUsage || !bytes.Contains(stream, []byte("usage"))) && whole != string(stream) {
			t.Fatalf("stream %q came out as %q", stream, whole)
		}
	})
}
