package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func TestEventScannerInspect(t *testing.T) {
	const head = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",`
	tests := []struct {
		name       string
		hide       bool
		event      string
		wantOut    string // the event as forwarded; "" when dropped
		wantTokens int
		wantUsage  usage
		wantDone   bool
	}{
		{
			name:      "role announcement is not content",
			event:     "data: " + head + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n",
			wantUsage: noUsage,
		},
		{
			name:       "content delta",
			event:      "data: " + head + `"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}` + "\n\n",
			wantTokens: 1,
			wantUsage:  noUsage,
		},
		{
			name:       "text completion",
			event:      `data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":" the"}]}` + "\n\n",
			wantTokens: 1,
			wantUsage:  noUsage,
		},
		{
			name:       "tool call delta",
			event:      "data: " + head + `"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}` + "\n\n",
			wantTokens: 1,
			wantUsage:  noUsage,
		},
		{
			name:       "reasoning delta",
			event:      "data: " + head + `"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}` + "\n\n",
			wantTokens: 1,
			wantUsage:  noUsage,
		},
		{
			name:      "finish",
			event:     "data: " + head + `"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n",
			wantUsage: noUsage,
		},
		{
			name:      "usage chunk the client asked for",
			event:     "data: " + head + `"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":3,"total_tokens":53,"prompt_tokens_details":{"cached_tokens":32}}}` + "\n\n",
			wantUsage: usage{prompt: 50, cached: 32, completion: 3},
		},
		{
			name:      "usage chunk the client did not ask for is dropped",
			hide:      true,
			event:     "data: " + head + `"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":3,"prompt_tokens_details":null}}` + "\n\n",
			wantOut:   "-",
			wantUsage: usage{prompt: 50, cached: -1, completion: 3},
		},
		{
			name:       `"usage":null is cut when hidden`,
			hide:       true,
			event:      "data: " + head + `"choices":[{"index":0,"delta":{"content":"Hi"}}],"usage":null}` + "\n\n",
			wantOut:    "data: " + head + `"choices":[{"index":0,"delta":{"content":"Hi"}}]}` + "\n\n",
			wantTokens: 1,
			wantUsage:  noUsage,
		},
		{
			name:      `"usage":null first`,
			hide:      true,
			event:     `data: {"usage": null , "choices":[]}` + "\n\n",
			wantOut:   `data: {"choices":[]}` + "\n\n",
			wantUsage: noUsage,
		},
		{
			name:      `"usage":null alone`,
			hide:      true,
			event:     `data: {"usage":null}` + "\n\n",
			wantOut:   `data: {}` + "\n\n",
			wantUsage: noUsage,
		},
		{
			name:      `"usage":null kept when asked for`,
			event:     `data: {"choices":[],"usage":null}` + "\n\n",
			wantUsage: noUsage,
		},
		{
			name:      "done",
			hide:      true,
			event:     "data: [DONE]\n\n",
			wantUsage: noUsage,
			wantDone:  true,
		},
		{
			name:       "CRLF, no space after the colon, other fields",
			event:      "event: message\r\nid: 4\r\ndata:{\"choices\":[{\"text\":\"a\"}]}\r\n\r\n",
			wantTokens: 1,
			wantUsage:  noUsage,
		},
		{
			name:      "comment and an error event pass",
			hide:      true,
			event:     ": keep-alive\ndata: {\"error\":{\"message\":\"boom\"}}\n\n",
			wantUsage: noUsage,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := eventScanner{hideUsage: tt.hide, usage: noUsage}
			drop, from, to := s.inspect([]byte(tt.event))
			out := tt.event[:from] + tt.event[to:]
			if drop {
				out = "-"
			}
			want := tt.wantOut
			if want == "" {
				want = tt.event
			}
			if out != want {
				t.Errorf("forwarded %q, want %q", out, want)
			}
			if s.tokens != tt.wantTokens || s.usage != tt.wantUsage || s.done != tt.wantDone {
				t.Errorf("tokens %d usage %+v done %v; want %d %+v %v",
					s.tokens, s.usage, s.done, tt.wantTokens, tt.wantUsage, tt.wantDone)
			}
			if from := strings.Index(out, "data: "); from >= 0 && !drop && out != tt.event {
				if data := strings.TrimSpace(out[from+6:]); !json.Valid([]byte(data)) {
					t.Errorf("edited chunk %q is not JSON", data)
				}
			}
		})
	}
}

// copyEvents must forward the bytes it is given, whatever the reads' sizes,
// event by event.
func TestCopyEventsPassThrough(t *testing.T) {
	stream := "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\n" +
		": comment\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("b", 3*streamBufBytes) + "\"}}]}\n\n" +
		"data: [DONE]\n\n" +
		"data: trailing bytes without a blank line"
	for _, tt := range []struct {
		name string
		r    io.Reader
	}{
		{"whole", strings.NewReader(stream)},
		{"byte by byte", iotest.OneByteReader(strings.NewReader(stream))},
		{"halves", iotest.HalfReader(strings.NewReader(stream))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			sc := eventScanner{usage: noUsage}
			firsts := 0
			rerr, werr := copyEvents(rec, tt.r, &sc, func() { firsts++ })
			if rerr != nil || werr != nil {
				t.Fatalf("copy: %v, %v", rerr, werr)
			}
			if got := rec.Body.String(); got != stream {
				t.Errorf("forwarded %d bytes, want the %d given", len(got), len(stream))
			}
			if sc.tokens != 2 || !sc.done || firsts != 1 {
				t.Errorf("tokens %d done %v firsts %d, want 2 true 1", sc.tokens, sc.done, firsts)
			}
		})
	}
}

func TestCopyEventsErrors(t *testing.T) {
	t.Run("read error", func(t *testing.T) {
		boom := errors.New("boom")
		r := io.MultiReader(strings.NewReader("data: {}\n\n"), iotest.ErrReader(boom))
		rerr, werr := copyEvents(httptest.NewRecorder(), r, &eventScanner{}, func() {})
		if !errors.Is(rerr, boom) || werr != nil {
			t.Errorf("got %v, %v; want the read error", rerr, werr)
		}
	})
	t.Run("event too large", func(t *testing.T) {
		r := io.LimitReader(infiniteData{}, 2*maxEventBytes)
		rerr, _ := copyEvents(httptest.NewRecorder(), r, &eventScanner{}, func() {})
		if !errors.Is(rerr, errEventTooLarge) {
			t.Errorf("got %v, want errEventTooLarge", rerr)
		}
	})
}

type infiniteData struct{}

func (infiniteData) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

func TestParseUsage(t *testing.T) {
	tests := []struct {
		in     string
		want   usage
		wantOK bool
	}{
		{`{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}`, usage{10, 8, 2}, true},
		{`{"prompt_tokens":10,"completion_tokens":2}`, usage{10, -1, 2}, true},
		{`{"prompt_tokens":10.0,"prompt_tokens_details":{"cached_tokens":null}}`, usage{10, -1, -1}, true},
		{`null`, noUsage, false},
		{``, noUsage, false},
	}
	for _, tt := range tests {
		got, ok := parseUsage([]byte(tt.in))
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("parseUsage(%s) = %+v, %v; want %+v, %v", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}

// FuzzInspect feeds arbitrary events to the scanner: it must not panic, and
// what it forwards must be the event or a part of it.
func FuzzInspect(f *testing.F) {
	for _, s := range []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n",
		"data: {\"usage\":nul",
		"data: {\"a\":\"\\\"}\n\n",
		"data: [{]}\n\n",
		"data: {\"usage\":null,\n\n",
	} {
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, ev []byte, hide bool) {
		s := eventScanner{hideUsage: hide}
		drop, from, to := s.inspect(ev)
		if drop {
			return
		}
		if from < 0 || to < from || to > len(ev) {
			t.Fatalf("cut [%d:%d] outside the event of %d bytes", from, to, len(ev))
		}
		_ = bytes.Clone(ev[:from])
	})
}

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

// The events of one read go out in one write and one flush, except those
// edited on the way (usage taken back out), and the first content is
// announced once it is written.
func TestCopyEventsCoalescesARead(t *testing.T) {
	role := "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
	chunk := func(s string) string { return "data: {\"choices\":[{\"delta\":{\"content\":\"" + s + "\"}}]}\n\n" }
	withNull := "data: {\"choices\":[{\"delta\":{\"content\":\"c\"}}],\"usage\":null}\n\n"
	usageOnly := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3}}\n\n"
	done := "data: [DONE]\n\n"
	for _, tt := range []struct {
		name           string
		stream, want   string
		hide           bool
		writes, tokens int
	}{
		{"as they are", role + chunk("a") + chunk("b") + done, role + chunk("a") + chunk("b") + done, false, 1, 2},
		{"usage hidden", role + chunk("a") + withNull + chunk("b") + usageOnly + done,
			role + chunk("a") + chunk("c") + chunk("b") + done, true, 1 + 2 + 1 + 1, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := &countingWriter{header: http.Header{}}
			sc := eventScanner{usage: noUsage, hideUsage: tt.hide}
			firsts := 0
			onFirst := func() {
				firsts++
				if !strings.Contains(w.body.String(), "\"a\"") {
					t.Errorf("first content announced before it was written: %q", w.body.String())
				}
			}
			rerr, werr := copyEvents(w, strings.NewReader(tt.stream), &sc, onFirst)
			if rerr != nil || werr != nil {
				t.Fatalf("copy: %v, %v", rerr, werr)
			}
			if got := w.body.String(); got != tt.want {
				t.Errorf("forwarded\n%q\nwant\n%q", got, tt.want)
			}
			if w.writes != tt.writes || w.flushes != 1 || firsts != 1 || sc.tokens != tt.tokens {
				t.Errorf("%d writes, %d flushes, %d first calls, %d tokens; want %d, 1, 1, %d",
					w.writes, w.flushes, firsts, sc.tokens, tt.writes, tt.tokens)
			}
		})
	}
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
			sc := eventScanner{usage: noUsage}
			if rerr, werr := copyEvents(hw, idleReader{r: r, a: a}, &sc, func() {}); rerr != nil || werr != nil {
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
