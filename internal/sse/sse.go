// Package sse carries an OpenAI event stream from a backend to the client:
// it reads each event as it passes (content chunks, the usage, the
// Responses API's response id), can take out a usage chunk the client did
// not ask for, and copies the stream event by event with a flush per read,
// allocating nothing per event. Non-streamed bodies share its usage reader
// (ParseUsage) and its flushing (FlusherOf, Flush).
package sse

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/internal/jsonscan"
	"github.com/kvroute/kvroute/internal/upstream"
)

// Usage is a response's token accounting; -1 where the response did not
// say.
type Usage struct {
	Prompt, Cached, Completion int
}

// NoUsage is the Usage of a response that reported none.
var NoUsage = Usage{-1, -1, -1}

// ParseUsage reads an OpenAI usage object: chat and completions'
// (prompt_tokens, prompt_tokens_details.cached_tokens, completion_tokens)
// or the Responses API's (input_tokens, input_tokens_details.cached_tokens,
// output_tokens). ok is false if v is not an object.
func ParseUsage(v []byte) (u Usage, ok bool) {
	if !jsonscan.IsObject(v) {
		return NoUsage, false
	}
	u = NoUsage
	for m := range jsonscan.Members(v) {
		x := v[m.Val:m.End]
		switch {
		case m.Is("prompt_tokens"):
			u.Prompt = jsonscan.IntValue(x)
		case m.Is("completion_tokens"):
			u.Completion = jsonscan.IntValue(x)
		case m.Is("prompt_tokens_details"), m.Is("input_tokens_details"):
			u.Cached = jsonscan.IntValue(jsonscan.Field(x, "cached_tokens"))
		case m.Is("input_tokens"):
			u.Prompt = jsonscan.IntValue(x)
		case m.Is("output_tokens"):
			u.Completion = jsonscan.IntValue(x)
		}
	}
	return u, true
}

// Scanner reads the OpenAI chunks of an event stream on their way to
// the client: it counts the chunks that carry content, keeps the last usage
// and notes [DONE]. It reads the Responses API's typed events too: a
// "response.….delta" event with a non-empty delta (output text, reasoning,
// refusal, function call arguments) carries content, and the "response"
// object of response.completed (or .incomplete, .failed) its usage; and
// the Messages API's (messages.go). When
// HideUsage is set the front asked for usage on the client's behalf, and
// the scanner says how to take it back out: drop the usage-only chunk and
// cut `"usage":null` from the others. A Scanner reads one stream, on one
// goroutine.
type Scanner struct {
	// HideUsage is set when the front asked for usage on the client's
	// behalf: the usage chunk is dropped, `"usage":null` cut.
	HideUsage bool

	// Tokens is the number of chunks that carried content so far.
	Tokens int
	// Usage is the latest usage seen, valid if SawUsage.
	Usage    Usage
	SawUsage bool
	// Done is set once `data: [DONE]` went by.
	Done bool
	// ResponseID is the Responses API response's id, from the first event
	// that carries the response object (response.created).
	ResponseID string
	// Rec, when not nil, records what a stream that may have to continue
	// elsewhere needs (record.go); it then also stops the copy at the
	// backend's error event rather than forwarding it.
	Rec *Record
}

// inspect examines one complete event (its lines and the blank line that
// ends it) and says how to forward it: not at all (drop), or whole except
// for the bytes ev[cutFrom:cutTo].
func (s *Scanner) inspect(ev []byte) (drop bool, cutFrom, cutTo int) {
	dataLines, usageOnly := 0, false
	for off := 0; off < len(ev); {
		end := bytes.IndexByte(ev[off:], '\n')
		if end < 0 {
			end = len(ev)
		} else {
			end += off
		}
		line := ev[off:end]
		start := off
		off = end + 1
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue
		}
		dataLines++
		start += len("data:")
		if start < end && ev[start] == ' ' {
			start++
		}
		data := bytes.TrimRight(ev[start:end], "\r")
		if string(data) == "[DONE]" {
			s.Done = true
			continue
		}
		if !jsonscan.IsObject(data) {
			continue
		}
		var choices, typ, delta, resp, msg []byte
		var use jsonscan.Member
		hasUse := false
		var id ident // for Rec
		for m := range jsonscan.Members(data) {
			switch {
			case m.Is("choices"):
				choices = data[m.Val:m.End]
			case m.Is("usage"):
				use, hasUse = m, true
			case m.Is("type"):
				typ = data[m.Val:m.End]
			case m.Is("delta"):
				delta = data[m.Val:m.End]
			case m.Is("response"):
				resp = data[m.Val:m.End]
			case m.Is("message"):
				msg = data[m.Val:m.End]
			case s.Rec != nil:
				id.note(m, data)
			}
		}
		if s.Rec != nil && s.Rec.note(data, &id, choices) {
			return true, 0, 0 // the backend's error event: the copy stops
		}
		if hasContent(choices) || isResponseDelta(typ, delta) || isMessagesDelta(typ, delta) {
			s.Tokens++
		}
		if s.messagesUsage(typ, msg, data, use, hasUse) { // messages.go
			continue
		}
		if jsonscan.IsObject(resp) {
			if s.ResponseID == "" {
				s.ResponseID = jsonscan.StringValue(jsonscan.Field(resp, "id"))
			}
			// A Responses API event: its usage is the response's, set in
			// the events that end it.
			if u, ok := ParseUsage(jsonscan.Field(resp, "usage")); ok {
				s.Usage, s.SawUsage = u, true
			}
		}
		if !hasUse {
			continue
		}
		uv := data[use.Val:use.End]
		if u, ok := ParseUsage(uv); ok {
			s.Usage, s.SawUsage = u, true
			usageOnly = s.HideUsage && (choices == nil || jsonscan.IsEmptyArray(choices))
		} else if s.HideUsage && jsonscan.IsNull(uv) && cutTo == 0 {
			from, to := memberSpan(data, use)
			cutFrom, cutTo = start+from, start+to
		}
	}
	if usageOnly && dataLines == 1 {
		return true, 0, 0
	}
	return false, cutFrom, cutTo
}

// isResponseDelta reports whether a Responses API event of type typ (a raw
// JSON string) with the delta jsonscan.Member delta carries output: a
// response.output_text.delta, response.reasoning_text.delta,
// response.refusal.delta, response.function_call_arguments.delta and the
// like, with a non-empty delta.
func isResponseDelta(typ, delta []byte) bool {
	// The raw string, compared without decoding: event types are plain
	// ASCII names.
	return len(typ) > len(`"response..delta"`) && jsonscan.NonEmpty(delta) &&
		bytes.HasPrefix(typ, []byte(`"response.`)) && bytes.HasSuffix(typ, []byte(`.delta"`))
}

// memberSpan returns the bytes of obj to remove to delete jsonscan.Member m and one
// of the commas around it.
func memberSpan(obj []byte, m jsonscan.Member) (from, to int) {
	// Prefer the comma before it: `,"usage":null`.
	i := m.Key - 1
	for i >= 0 && (obj[i] == ' ' || obj[i] == '\t' || obj[i] == '\n' || obj[i] == '\r') {
		i--
	}
	if i >= 0 && obj[i] == ',' {
		return i, m.End
	}
	// The first member: take the comma after it, if any.
	j := jsonscan.SkipSpace(obj, m.End)
	if j < len(obj) && obj[j] == ',' {
		return m.Key, jsonscan.SkipSpace(obj, j+1)
	}
	return m.Key, m.End
}

// hasContent reports whether the choices of a chunk carry output: text, a
// content or reasoning delta, or a tool call. The chat role announcement
// that opens a stream (`"delta":{"role":"assistant","content":""}`) does
// not count.
func hasContent(choices []byte) bool {
	for c := range jsonscan.Elems(choices) {
		for m := range jsonscan.Members(c) {
			v := c[m.Val:m.End]
			switch {
			case m.Is("text"):
				if jsonscan.NonEmpty(v) {
					return true
				}
			case m.Is("delta"):
				for d := range jsonscan.Members(v) {
					x := v[d.Val:d.End]
					if (d.Is("content") || d.Is("reasoning_content") || d.Is("reasoning") ||
						d.Is("tool_calls") || d.Is("function_call")) && jsonscan.NonEmpty(x) {
						return true
					}
				}
			}
		}
	}
	return false
}

// eventEnd finds the end of the event that starts at or before scan in b:
// the index just past the blank line that ends it. scan must be at the start
// of a line. If b holds no blank line yet, eventEnd returns -1 and where to
// resume scanning once more bytes arrive.
func eventEnd(b []byte, scan int) (end, next int) {
	for {
		j := bytes.IndexByte(b[scan:], '\n')
		if j < 0 {
			return -1, scan
		}
		line := b[scan : scan+j]
		scan += j + 1
		if len(line) == 0 || (len(line) == 1 && line[0] == '\r') {
			return scan, scan
		}
	}
}

// Stream buffers. One read of a backend's stream rarely holds more than a
// few chunks; an event that does not fit grows the buffer, up to
// maxEventBytes, which no OpenAI chunk comes near (a chunk is a token or a
// few, with logprobs at most some kilobytes).
const (
	streamBufBytes = 8 << 10
	maxEventBytes  = 4 << 20
)

var streamBufs = sync.Pool{New: func() any { b := make([]byte, streamBufBytes); return &b }}

// errEventTooLarge is a backend's stream that is not made of SSE events.
var errEventTooLarge = fmt.Errorf("event stream: an event is larger than %d bytes", maxEventBytes)

// Copy copies an event stream from src to w one complete event at a
// time, and flushes once the events of a read are written: no event waits
// in a buffer while the proxy waits for the backend, and the events that
// came in one read (the backend's were already buffered) go out in one
// write. Each event goes through sc.inspect on its way; onFirst is called
// when the first chunk with content has been written. It returns the
// backend's read error or the client's write error, whichever ended the
// copy; both nil at the end of the stream. What is written with the
// stream's end is not flushed: the handler's return flushes it with the
// response's last chunk, in one write to the client where a flush here
// would make two (and wake the client twice). It allocates nothing per
// event.
func Copy(w http.ResponseWriter, src io.Reader, sc *Scanner, onFirst func()) (readErr, writeErr error) {
	var first FirstNoter
	if onFirst != nil {
		first = noteFirst(onFirst)
	}
	return new(Copier).Copy(w, src, sc, first)
}

// FirstNoter is told when the first content has been written: the
// proxy's attempt is one (an interface holding it allocates nothing, where
// its method value would be an allocation a request).
type FirstNoter interface{ FirstToken() }

// noteFirst is a func as a FirstNoter.
type noteFirst func()

func (f noteFirst) FirstToken() { f() }

// Copy is the function Copy with the copier's state in ec, a zero Copier
// that may live in a larger object (the proxy's attempt): on its own it
// would be allocated for every stream, as a push takes it as an interface.
func (ec *Copier) Copy(w http.ResponseWriter, src io.Reader, sc *Scanner, onFirst FirstNoter) (readErr, writeErr error) {
	rc := FlusherOf(w)
	bp := streamBufs.Get().(*[]byte)
	defer streamBufs.Put(bp) // a grown buffer is left to the GC
	*ec = Copier{w: w, rc: rc, sc: sc, onFirst: onFirst, buf: *bp}
	defer func() { ec.buf = nil }() // the buffer goes back to the pool
	if p, ok := src.(upstream.Pusher); ok {
		if pushed, err := p.Push(ec); pushed {
			return ec.endPush(err)
		}
	}
	for {
		rerr := ec.read(src)
		if rerr == errEventTooLarge {
			return rerr, nil
		}
		wrote, err := ec.forward()
		if err != nil {
			return nil, err
		}
		if ec.sc.failed() {
			return ErrErrorEvent, Flush(rc)
		}
		if rerr != nil {
			if !errors.Is(rerr, io.EOF) {
				return rerr, nil
			}
			// A stream that ends without a blank line still ends its
			// last event; what this read brought goes out with the
			// response's end.
			_, err := ec.forwardRest()
			return nil, err
		}
		if wrote {
			if err := Flush(rc); err != nil {
				return nil, err
			}
		}
	}
}

// Copier is Copy's state: buf[head:tail] holds bytes read and not
// yet written; the events in it end at or after scan.
type Copier struct {
	w                http.ResponseWriter
	rc               Flusher
	sc               *Scanner
	onFirst          FirstNoter
	buf              []byte
	head, tail, scan int
	// When pushed: unflushed is set while events written wait for a
	// flush; werr is the client's write error that stopped the push.
	unflushed bool
	werr      error
	// rerr is the backend's failure that stopped the push: its error
	// event (with Scanner.Rec).
	rerr error
}

var _ upstream.Sink = (*Copier)(nil)

// Space makes room as read does, and also moves a partial event to the
// front when less than a quarter of the buffer is free, so that a read is
// not cut short by the buffer's end.
func (ec *Copier) Space() ([]byte, error) {
	if ec.head > 0 && len(ec.buf)-ec.tail < len(ec.buf)/4 {
		ec.compact()
	}
	if err := ec.makeRoom(); err != nil {
		return nil, err
	}
	return ec.buf[ec.tail:], nil
}

// Took forwards the complete events among the n bytes pushed, and flushes
// them unless more are waiting: those go out in the same flush.
func (ec *Copier) Took(n int, more bool) error {
	ec.tail += n
	wrote, err := ec.forward()
	if err == nil && ec.sc.failed() {
		ec.rerr = ErrErrorEvent
		return ec.rerr
	}
	if err == nil {
		ec.unflushed = ec.unflushed || wrote
		if ec.unflushed && !more {
			ec.unflushed = false
			err = Flush(ec.rc)
		}
	}
	ec.werr = err
	return err
}

// endPush ends a pushed stream as Copy's loop ends a read one; err is
// push's. The events of the last read were not flushed (took was told the
// body ended with them): they go out with the response's end.
func (ec *Copier) endPush(err error) (readErr, writeErr error) {
	switch {
	case ec.rerr != nil:
		return ec.rerr, Flush(ec.rc)
	case ec.werr != nil:
		return nil, ec.werr
	case err != nil:
		return err, nil
	}
	_, err = ec.forwardRest()
	return nil, err
}

// read reads once from src into the free end of the buffer, first making
// room: moving the unwritten bytes to the front, or growing the buffer for
// an event larger than it (up to maxEventBytes).
func (ec *Copier) read(src io.Reader) error {
	if err := ec.makeRoom(); err != nil {
		return err
	}
	n, err := src.Read(ec.buf[ec.tail:])
	ec.tail += n
	return err
}

// makeRoom makes the buffer's free end non-empty, if it is full: by moving
// the unwritten bytes to the front, or by growing it for an event larger
// than it (up to maxEventBytes).
func (ec *Copier) makeRoom() error {
	if ec.tail < len(ec.buf) {
		return nil
	}
	switch {
	case ec.head > 0:
		ec.compact()
	case len(ec.buf) >= maxEventBytes:
		return errEventTooLarge
	default:
		grown := make([]byte, 2*len(ec.buf))
		copy(grown, ec.buf[:ec.tail])
		ec.buf = grown
	}
	return nil
}

// compact moves the unwritten bytes to the buffer's front.
func (ec *Copier) compact() {
	ec.tail = copy(ec.buf, ec.buf[ec.head:ec.tail])
	ec.scan -= ec.head
	ec.head = 0
}

// forward writes the complete events in the buffer, each as sc.inspect
// says, and reports whether it wrote any. Events forwarded whole go out
// together, in one write.
func (ec *Copier) forward() (wrote bool, err error) {
	run := ec.head // the events from run to head go out as they are
	for {
		end, next := eventEnd(ec.buf[:ec.tail], ec.scan)
		ec.scan = next
		if end < 0 {
			break
		}
		before := ec.sc.Tokens
		drop, from, to := ec.sc.inspect(ec.buf[ec.head:end])
		if drop || to > from {
			// This event is edited: what came before it goes first.
			if err := ec.write(run, ec.head, before); err != nil {
				return false, err
			}
			if !drop {
				ev := ec.buf[ec.head:end]
				if _, err := ec.w.Write(ev[:from]); err != nil {
					return false, err
				}
				if _, err := ec.w.Write(ev[to:]); err != nil {
					return false, err
				}
				ec.firstContent(ec.sc.Tokens)
			}
			run = end
		}
		ec.head, wrote = end, wrote || !drop
		if drop && ec.sc.failed() {
			// Nothing after the backend's error event goes out: the
			// stream continues elsewhere, or ends with kvroute's own.
			ec.head, ec.tail, ec.scan, run = 0, 0, 0, 0
			return wrote, nil
		}
	}
	if err := ec.write(run, ec.head, ec.sc.Tokens); err != nil {
		return false, err
	}
	if ec.head == ec.tail {
		ec.head, ec.tail, ec.scan = 0, 0, 0
	}
	return wrote, nil
}

// forwardRest writes the bytes after the last complete event, the end of a
// stream that did not end with a blank line, as an event of its own; it
// reports whether it wrote any.
func (ec *Copier) forwardRest() (bool, error) {
	if ec.tail <= ec.head {
		return false, nil
	}
	ec.scan = ec.tail
	end := ec.tail
	drop, from, to := ec.sc.inspect(ec.buf[ec.head:end])
	ev := ec.buf[ec.head:end]
	ec.head = end
	switch {
	case drop:
		return false, nil
	case to > from:
		if _, err := ec.w.Write(ev[:from]); err != nil {
			return false, err
		}
		ev = ev[to:]
	}
	if _, err := ec.w.Write(ev); err != nil {
		return false, err
	}
	ec.firstContent(ec.sc.Tokens)
	return true, nil
}

// write writes buf[from:to], events forwarded whole; written is the
// scanner's count of content chunks up to their end.
func (ec *Copier) write(from, to, written int) error {
	if to <= from {
		return nil
	}
	if _, err := ec.w.Write(ec.buf[from:to]); err != nil {
		return err
	}
	ec.firstContent(written)
	return nil
}

// firstContent calls onFirst, once, when the events written so far hold
// written content chunks.
func (ec *Copier) firstContent(written int) {
	if written > 0 && ec.onFirst != nil {
		ec.onFirst.FirstToken()
		ec.onFirst = nil
	}
}

// Flusher flushes a response writer, reporting the error.
type Flusher interface{ FlushError() error }

// FlusherOf returns w's own FlushError when it has one (net/http's writer,
// the proxy's held writer), else a ResponseController's Flush, which
// allocates.
func FlusherOf(w http.ResponseWriter) Flusher {
	if f, ok := w.(Flusher); ok {
		return f
	}
	return controllerFlusher{http.NewResponseController(w)}
}

// controllerFlusher flushes through a ResponseController.
type controllerFlusher struct{ rc *http.ResponseController }

func (f controllerFlusher) FlushError() error { return f.rc.Flush() }

// Flush sends what rc's writer has buffered to the client. A writer that
// cannot flush (wrapped by middleware that hides it) is not an error: the
// data still goes out, only later.
func Flush(rc Flusher) error {
	if err := rc.FlushError(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

// IsEventStream reports whether the content type ct is text/event-stream.
func IsEventStream(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}
