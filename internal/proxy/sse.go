package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// usage is a response's token accounting; -1 where the response did not say.
type usage struct {
	prompt, cached, completion int
}

var noUsage = usage{-1, -1, -1}

// parseUsage reads an OpenAI usage object: chat and completions'
// (prompt_tokens, prompt_tokens_details.cached_tokens, completion_tokens)
// or the Responses API's (input_tokens, input_tokens_details.cached_tokens,
// output_tokens). ok is false if v is not an object.
func parseUsage(v []byte) (u usage, ok bool) {
	if !isObject(v) {
		return noUsage, false
	}
	u = noUsage
	for m := range members(v) {
		x := v[m.val:m.end]
		switch {
		case m.is("prompt_tokens"):
			u.prompt = intValue(x)
		case m.is("completion_tokens"):
			u.completion = intValue(x)
		case m.is("prompt_tokens_details"), m.is("input_tokens_details"):
			u.cached = intValue(field(x, "cached_tokens"))
		case m.is("input_tokens"):
			u.prompt = intValue(x)
		case m.is("output_tokens"):
			u.completion = intValue(x)
		}
	}
	return u, true
}

// eventScanner reads the OpenAI chunks of an event stream on their way to
// the client: it counts the chunks that carry content, keeps the last usage
// and notes [DONE]. It reads the Responses API's typed events too: a
// "response.….delta" event with a non-empty delta (output text, reasoning,
// refusal, function call arguments) carries content, and the "response"
// object of response.completed (or .incomplete, .failed) its usage. When hideUsage is set the proxy asked for usage on the
// client's behalf, and the scanner says how to take it back out: drop the
// usage-only chunk and cut `"usage":null` from the others.
type eventScanner struct {
	hideUsage bool

	// tokens is the number of chunks that carried content so far.
	tokens int
	// usage is the latest usage seen, valid if sawUsage.
	usage    usage
	sawUsage bool
	// done is set once `data: [DONE]` went by.
	done bool
	// responseID is the Responses API response's id, from the first event
	// that carries the response object (response.created).
	responseID string
}

// inspect examines one complete event (its lines and the blank line that
// ends it) and says how to forward it: not at all (drop), or whole except
// for the bytes ev[cutFrom:cutTo].
func (s *eventScanner) inspect(ev []byte) (drop bool, cutFrom, cutTo int) {
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
			s.done = true
			continue
		}
		if !isObject(data) {
			continue
		}
		var choices, typ, delta, resp []byte
		var use member
		hasUse := false
		for m := range members(data) {
			switch {
			case m.is("choices"):
				choices = data[m.val:m.end]
			case m.is("usage"):
				use, hasUse = m, true
			case m.is("type"):
				typ = data[m.val:m.end]
			case m.is("delta"):
				delta = data[m.val:m.end]
			case m.is("response"):
				resp = data[m.val:m.end]
			}
		}
		if hasContent(choices) || isResponseDelta(typ, delta) {
			s.tokens++
		}
		if isObject(resp) {
			if s.responseID == "" {
				s.responseID = stringValue(field(resp, "id"))
			}
			// A Responses API event: its usage is the response's, set in
			// the events that end it.
			if u, ok := parseUsage(field(resp, "usage")); ok {
				s.usage, s.sawUsage = u, true
			}
		}
		if !hasUse {
			continue
		}
		uv := data[use.val:use.end]
		if u, ok := parseUsage(uv); ok {
			s.usage, s.sawUsage = u, true
			usageOnly = s.hideUsage && (choices == nil || isEmptyArray(choices))
		} else if s.hideUsage && isNull(uv) && cutTo == 0 {
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
// JSON string) with the delta member delta carries output: a
// response.output_text.delta, response.reasoning_text.delta,
// response.refusal.delta, response.function_call_arguments.delta and the
// like, with a non-empty delta.
func isResponseDelta(typ, delta []byte) bool {
	// The raw string, compared without decoding: event types are plain
	// ASCII names.
	return len(typ) > len(`"response..delta"`) && nonEmpty(delta) &&
		bytes.HasPrefix(typ, []byte(`"response.`)) && bytes.HasSuffix(typ, []byte(`.delta"`))
}

// memberSpan returns the bytes of obj to remove to delete member m and one
// of the commas around it.
func memberSpan(obj []byte, m member) (from, to int) {
	// Prefer the comma before it: `,"usage":null`.
	i := m.key - 1
	for i >= 0 && (obj[i] == ' ' || obj[i] == '\t' || obj[i] == '\n' || obj[i] == '\r') {
		i--
	}
	if i >= 0 && obj[i] == ',' {
		return i, m.end
	}
	// The first member: take the comma after it, if any.
	j := skipSpace(obj, m.end)
	if j < len(obj) && obj[j] == ',' {
		return m.key, skipSpace(obj, j+1)
	}
	return m.key, m.end
}

// hasContent reports whether the choices of a chunk carry output: text, a
// content or reasoning delta, or a tool call. The chat role announcement
// that opens a stream (`"delta":{"role":"assistant","content":""}`) does
// not count.
func hasContent(choices []byte) bool {
	for c := range elems(choices) {
		for m := range members(c) {
			v := c[m.val:m.end]
			switch {
			case m.is("text"):
				if nonEmpty(v) {
					return true
				}
			case m.is("delta"):
				for d := range members(v) {
					x := v[d.val:d.end]
					if (d.is("content") || d.is("reasoning_content") || d.is("reasoning") ||
						d.is("tool_calls") || d.is("function_call")) && nonEmpty(x) {
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

// copyEvents copies an event stream from src to w one complete event at a
// time, flushing as soon as the events of a read are written, so that no
// event waits in a buffer while the proxy waits for the backend. Each event
// goes through sc.inspect on its way; onFirst is called when the first chunk
// with content has been written. It returns the backend's read error or the
// client's write error, whichever ended the copy; both nil at the end of the
// stream.
func copyEvents(w http.ResponseWriter, src io.Reader, sc *eventScanner, onFirst func()) (readErr, writeErr error) {
	rc := http.NewResponseController(w)
	bp := streamBufs.Get().(*[]byte)
	defer streamBufs.Put(bp) // a grown buffer is left to the GC
	buf := *bp

	// buf[head:tail] holds bytes read and not yet written; the events in it
	// end at or after scan.
	head, tail, scan := 0, 0, 0
	write := func(ev []byte) error {
		before := sc.tokens
		drop, from, to := sc.inspect(ev)
		switch {
		case drop:
			return nil
		case to > from:
			if _, err := w.Write(ev[:from]); err != nil {
				return err
			}
			ev = ev[to:]
		}
		if _, err := w.Write(ev); err != nil {
			return err
		}
		if before == 0 && sc.tokens > 0 {
			onFirst()
		}
		return nil
	}
	for {
		if tail == len(buf) {
			switch {
			case head > 0:
				tail = copy(buf, buf[head:tail])
				scan -= head
				head = 0
			case len(buf) >= maxEventBytes:
				return errEventTooLarge, nil
			default:
				grown := make([]byte, 2*len(buf))
				copy(grown, buf[:tail])
				buf = grown
			}
		}
		n, rerr := src.Read(buf[tail:])
		tail += n
		wrote := false
		for {
			end, next := eventEnd(buf[:tail], scan)
			scan = next
			if end < 0 {
				break
			}
			if err := write(buf[head:end]); err != nil {
				return nil, err
			}
			head, wrote = end, true
		}
		if head == tail {
			head, tail, scan = 0, 0, 0
		}
		if rerr != nil {
			if !errors.Is(rerr, io.EOF) {
				return rerr, nil
			}
			// A stream that ends without a blank line still ends its
			// last event.
			if tail > head {
				if err := write(buf[head:tail]); err != nil {
					return nil, err
				}
				wrote = true
			}
			if wrote {
				return nil, flush(rc)
			}
			return nil, nil
		}
		if wrote {
			if err := flush(rc); err != nil {
				return nil, err
			}
		}
	}
}

// flush sends what w has buffered to the client. A writer that cannot flush
// (wrapped by middleware that hides it) is not an error: the data still
// goes out, only later.
func flush(rc *http.ResponseController) error {
	if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}
