package sse

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/kvroute/kvroute/internal/upstream"
)

func TestEventScannerInspect(t *testing.T) {
	const head = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",`
	tests := []struct {
		name       string
		hide       bool
		event      string
		wantOut    string // the event as forwarded; "" when dropped
		wantTokens int
		wantUsage  Usage
		wantDone   bool
	}{
		{
			name:      "role announcement is not content",
			event:     "data: " + head + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n",
			wantUsage: NoUsage,
		},
		{
			name:       "content delta",
			event:      "data: " + head + `"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}` + "\n\n",
			wantTokens: 1,
			wantUsage:  NoUsage,
		},
		{
			name:       "text completion",
			event:      `data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":" the"}]}` + "\n\n",
			wantTokens: 1,
			wantUsage:  NoUsage,
		},
		{
			name:       "tool call delta",
			event:      "data: " + head + `"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}` + "\n\n",
			wantTokens: 1,
			wantUsage:  NoUsage,
		},
		{
			name:       "reasoning delta",
			event:      "data: " + head + `"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}` + "\n\n",
			wantTokens: 1,
			wantUsage:  NoUsage,
		},
		{
			name:      "finish",
			event:     "data: " + head + `"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n",
			wantUsage: NoUsage,
		},
		{
			name:      "usage chunk the client asked for",
			event:     "data: " + head + `"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":3,"total_tokens":53,"prompt_tokens_details":{"cached_tokens":32}}}` + "\n\n",
			wantUsage: Usage{Prompt: 50, Cached: 32, Completion: 3},
		},
		{
			name:      "usage chunk the client did not ask for is dropped",
			hide:      true,
			event:     "data: " + head + `"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":3,"prompt_tokens_details":null}}` + "\n\n",
			wantOut:   "-",
			wantUsage: Usage{Prompt: 50, Cached: -1, Completion: 3},
		},
		{
			name:       `"usage":null is cut when hidden`,
			hide:       true,
			event:      "data: " + head + `"choices":[{"index":0,"delta":{"content":"Hi"}}],"usage":null}` + "\n\n",
			wantOut:    "data: " + head + `"choices":[{"index":0,"delta":{"content":"Hi"}}]}` + "\n\n",
			wantTokens: 1,
			wantUsage:  NoUsage,
		},
		{
			name:      `"usage":null first`,
			hide:      true,
			event:     `data: {"usage": null , "choices":[]}` + "\n\n",
			wantOut:   `data: {"choices":[]}` + "\n\n",
			wantUsage: NoUsage,
		},
		{
			name:      `"usage":null alone`,
			hide:      true,
			event:     `data: {"usage":null}` + "\n\n",
			wantOut:   `data: {}` + "\n\n",
			wantUsage: NoUsage,
		},
		{
			name:      `"usage":null kept when asked for`,
			event:     `data: {"choices":[],"usage":null}` + "\n\n",
			wantUsage: NoUsage,
		},
		{
			name:      "done",
			hide:      true,
			event:     "data: [DONE]\n\n",
			wantUsage: NoUsage,
			wantDone:  true,
		},
		{
			name:       "CRLF, no space after the colon, other fields",
			event:      "event: message\r\nid: 4\r\ndata:{\"choices\":[{\"text\":\"a\"}]}\r\n\r\n",
			wantTokens: 1,
			wantUsage:  NoUsage,
		},
		{
			name:      "comment and an error event pass",
			hide:      true,
			event:     ": keep-alive\ndata: {\"error\":{\"message\":\"boom\"}}\n\n",
			wantUsage: NoUsage,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Scanner{HideUsage: tt.hide, Usage: NoUsage}
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
			if s.Tokens != tt.wantTokens || s.Usage != tt.wantUsage || s.Done != tt.wantDone {
				t.Errorf("tokens %d usage %+v done %v; want %d %+v %v",
					s.Tokens, s.Usage, s.Done, tt.wantTokens, tt.wantUsage, tt.wantDone)
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
			sc := Scanner{Usage: NoUsage}
			firsts := 0
			rerr, werr := Copy(rec, tt.r, &sc, func() { firsts++ })
			if rerr != nil || werr != nil {
				t.Fatalf("copy: %v, %v", rerr, werr)
			}
			if got := rec.Body.String(); got != stream {
				t.Errorf("forwarded %d bytes, want the %d given", len(got), len(stream))
			}
			if sc.Tokens != 2 || !sc.Done || firsts != 1 {
				t.Errorf("tokens %d done %v firsts %d, want 2 true 1", sc.Tokens, sc.Done, firsts)
			}
		})
	}
}

func TestCopyEventsErrors(t *testing.T) {
	t.Run("read error", func(t *testing.T) {
		boom := errors.New("boom")
		r := io.MultiReader(strings.NewReader("data: {}\n\n"), iotest.ErrReader(boom))
		rerr, werr := Copy(httptest.NewRecorder(), r, &Scanner{}, func() {})
		if !errors.Is(rerr, boom) || werr != nil {
			t.Errorf("got %v, %v; want the read error", rerr, werr)
		}
	})
	t.Run("event too large", func(t *testing.T) {
		r := io.LimitReader(infiniteData{}, 2*maxEventBytes)
		rerr, _ := Copy(httptest.NewRecorder(), r, &Scanner{}, func() {})
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
		want   Usage
		wantOK bool
	}{
		{`{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}`, Usage{10, 8, 2}, true},
		{`{"prompt_tokens":10,"completion_tokens":2}`, Usage{10, -1, 2}, true},
		{`{"prompt_tokens":10.0,"prompt_tokens_details":{"cached_tokens":null}}`, Usage{10, -1, -1}, true},
		{`null`, NoUsage, false},
		{``, NoUsage, false},
	}
	for _, tt := range tests {
		got, ok := ParseUsage([]byte(tt.in))
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("ParseUsage(%s) = %+v, %v; want %+v, %v", tt.in, got, ok, tt.want, tt.wantOK)
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
		s := Scanner{HideUsage: hide}
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
			sc := Scanner{Usage: NoUsage, HideUsage: tt.hide}
			firsts := 0
			onFirst := func() {
				firsts++
				if !strings.Contains(w.body.String(), "\"a\"") {
					t.Errorf("first content announced before it was written: %q", w.body.String())
				}
			}
			rerr, werr := Copy(w, strings.NewReader(tt.stream), &sc, onFirst)
			if rerr != nil || werr != nil {
				t.Fatalf("copy: %v, %v", rerr, werr)
			}
			if got := w.body.String(); got != tt.want {
				t.Errorf("forwarded\n%q\nwant\n%q", got, tt.want)
			}
			if w.writes != tt.writes || w.flushes != 1 || firsts != 1 || sc.Tokens != tt.tokens {
				t.Errorf("%d writes, %d flushes, %d first calls, %d tokens; want %d, 1, 1, %d",
					w.writes, w.flushes, firsts, sc.Tokens, tt.writes, tt.tokens)
			}
		})
	}
}

func TestScannerResponsesEvents(t *testing.T) {
	var s Scanner
	for _, ev := range []string{
		"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"usage\":null}}\n\n",
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"\",\"item_id\":\"m\"}\n\n",
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\",\"item_id\":\"m\"}\n\n",
		"event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"text\":\"Hi\"}\n\n",
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"usage\":{\"input_tokens\":12,\"input_tokens_details\":{\"cached_tokens\":8},\"output_tokens\":1,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":13}}}\n\n",
	} {
		if drop, from, to := s.inspect([]byte(ev)); drop || from != to {
			t.Errorf("inspect(%q) = %v %d %d, want it forwarded whole", ev, drop, from, to)
		}
	}
	if s.Tokens != 1 || !s.SawUsage || s.Usage != (Usage{Prompt: 12, Cached: 8, Completion: 1}) {
		t.Errorf("tokens %d usage %+v (%v), want 1 token, usage 12/8/1", s.Tokens, s.Usage, s.SawUsage)
	}
}

var responsesEvents = []string{
	"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"usage\":null}}\n\n",
	"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n",
	"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"usage\":{\"input_tokens\":9,\"input_tokens_details\":{\"cached_tokens\":4},\"output_tokens\":1,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":10}}}\n\n",
}

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
		_, _ = ParseUsage(stream) // any bytes, not only an event's
		_ = hasContent(stream)
		run := func(n int) (string, Scanner) {
			rec := httptest.NewRecorder()
			sc := Scanner{HideUsage: hideUsage}
			firsts := 0
			readErr, writeErr := Copy(rec, &chunkReader{b: stream, n: n}, &sc, func() { firsts++ })
			if readErr != nil || writeErr != nil {
				t.Fatalf("copyEvents: %v, %v", readErr, writeErr)
			}
			if firsts > 1 || (firsts == 1) != (sc.Tokens > 0) {
				t.Fatalf("onFirst called %d times for %d content chunks", firsts, sc.Tokens)
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

// intSink keeps the benchmark's result alive.
var intSink int

// BenchmarkInspect is the scan of one streamed chunk, recorded for a
// continuation elsewhere (record.go) or not.
func BenchmarkInspect(b *testing.B) {
	ev := []byte(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n")
	for _, hide := range []bool{false, true} {
		for _, record := range []bool{false, true} {
			b.Run("hide="+strconv.FormatBool(hide)+"/record="+strconv.FormatBool(record), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(ev)))
				s := Scanner{HideUsage: hide}
				rec := new(Record)
				if record {
					s.Rec = rec
				}
				for b.Loop() {
					_, from, to := s.inspect(ev)
					intSink = from + to
					rec.Text = rec.Text[:0] // a stream's text, not the benchmark's
				}
			})
		}
	}
}

// Three events of a chat stream.
const (
	evHi    = `data: {"choices":[{"delta":{"content":"Hi"}}]}` + "\n\n"
	evThere = `data: {"choices":[{"delta":{"content":" there"}}]}` + "\n\n"
	evDone  = "data: [DONE]\n\n"
)

// piecePusher pushes its pieces, each as one read, the flag more set on
// those that are not a read's last.
type piecePusher struct {
	pieces []string
	more   []bool
}

var _ upstream.Pusher = (*piecePusher)(nil)

func (pp *piecePusher) Push(s upstream.Sink) (bool, error) {
	for i, piece := range pp.pieces {
		for piece != "" {
			p, err := s.Space()
			if err != nil {
				return true, err
			}
			k := copy(p, piece)
			piece = piece[k:]
			if err := s.Took(k, pp.more[i] || piece != ""); err != nil {
				return true, err
			}
		}
	}
	return true, nil
}

// A pushed stream goes through copyEvents whole, even pieces that split an
// event or outgrow the buffer, and the events of pieces that say more are
// waiting share the next flush.
func TestCopyEventsPushed(t *testing.T) {
	big := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 3*streamBufBytes) + "\"}}]}\n\n"
	tests := []struct {
		name    string
		pieces  []string
		more    []bool
		flushes int
	}{
		{name: "an event a read", pieces: []string{evHi, evThere, evDone}, more: []bool{false, false, false}, flushes: 3},
		{name: "split events", pieces: []string{evHi[:7], evHi[7:] + evThere[:3], evThere[3:], evDone}, more: []bool{false, false, false, false}, flushes: 3},
		{name: "more waiting", pieces: []string{evHi, evThere, evDone}, more: []bool{true, false, false}, flushes: 2},
		// The end's last event goes out with the response's end, unflushed.
		{name: "no blank line at the end", pieces: []string{evHi, "data: [DONE]"}, more: []bool{false, false}, flushes: 1},
		{name: "larger than the buffer", pieces: []string{evHi, big[:100], big[100:], evDone}, more: []bool{false, false, false, false}, flushes: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &countingWriter{header: http.Header{}}
			sc := Scanner{Usage: NoUsage}
			src := &piecePusher{pieces: tt.pieces, more: tt.more}
			rerr, werr := Copy(w, src, &sc, nil)
			if rerr != nil || werr != nil {
				t.Fatalf("copy: %v, %v", rerr, werr)
			}
			if want := strings.Join(tt.pieces, ""); w.body.String() != want {
				t.Errorf("forwarded %d bytes, want %d", w.body.Len(), len(want))
			}
			if w.flushes != tt.flushes {
				t.Errorf("%d flushes, want %d", w.flushes, tt.flushes)
			}
		})
	}
}

// piecePusher is also a Reader, which copyEvents must not use.
func (pp *piecePusher) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }
