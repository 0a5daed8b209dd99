package proxy

import (
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sse"
)

// countingWriter is a ResponseWriter that keeps what is written and counts
// the writes and flushes; with discard set it keeps nothing.
type countingWriter struct {
	header          http.Header
	body            bytes.Buffer
	discard         bool
	writes, flushes int
}

func (w *countingWriter) Header() http.Header { return w.header }
func (w *countingWriter) WriteHeader(int)     {}
func (w *countingWriter) Flush()              { w.flushes++ }
func (w *countingWriter) FlushError() error   { w.flushes++; return nil }
func (w *countingWriter) Write(b []byte) (int, error) {
	w.writes++
	if !w.discard {
		w.body.Write(b)
	}
	return len(b), nil
}

// eventReader hands out one event per read, as a backend's socket does
// when the proxy keeps up.
type eventReader struct {
	ev   []byte
	left int
}

func (r *eventReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	r.left--
	return copy(p, r.ev), nil
}

// Streaming allocates nothing per event: a stream of 500 events, one a
// read, through the attempt's idle watch and held writer, costs about what
// one of 10 does.
func TestCopyEventsAllocatesNothingPerEvent(t *testing.T) {
	ev := []byte("data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word\"},\"finish_reason\":null}]}\n\n")
	a := &attempt{p: &Proxy{}, first: true, wd: newWatchdog(func(error) {})}
	defer a.wd.stop()
	a.wd.idle(time.Hour)
	allocs := func(events int) float64 {
		w := &countingWriter{header: http.Header{}, discard: true}
		hw := &heldWriter{ResponseWriter: w, status: http.StatusOK, header: http.Header{}}
		r := &eventReader{ev: ev}
		return testing.AllocsPerRun(20, func() {
			r.left = events
			sc := sse.Scanner{Usage: sse.NoUsage}
			if rerr, werr := sse.Copy(hw, idleReader{r: r, a: a}, &sc, func() {}); rerr != nil || werr != nil {
				t.Fatal(rerr, werr)
			}
		})
	}
	// AllocsPerRun counts the whole process's allocations: a tenth of one
	// per event leaves room for other goroutines' and catches any that
	// every event makes.
	few, many := allocs(10), allocs(500)
	if many-few >= 490/10 {
		t.Errorf("%v allocations for 500 events, %v for 10: streaming allocates per event", many, few)
	}
}
