package proxy

import (
	"bytes"
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/jsonscan"
	"github.com/kvroute/kvroute/internal/sse"
)

// splice writes a continuation's events into the client's stream, which
// its first backend began (migrate.go): each chunk takes the stream's id,
// created and model; the chat role announcement that opens every stream is
// dropped (the client had it); the usage counts the original prompt once
// and every completion token (the continuation's prompt holds the text
// sent before it). It sits between the event copier and the client's
// writer, whose headers were sent with the first backend's response.
type splice struct {
	w   http.ResponseWriter
	rec *sse.Record
	// sent is how many content chunks reached the client before this
	// continuation began.
	sent int
	// firstAt is when the continuation's first content (or its finish)
	// went out; zero until it does.
	firstAt time.Time
	now     func() time.Time
	// pending holds the bytes of an event not yet complete (the copier
	// writes an edited event in parts).
	pending []byte
	out     []byte
}

// start readies s for a continuation of the stream recorded in rec,
// written to w.
func (s *splice) start(w http.ResponseWriter, rec *sse.Record) {
	s.w, s.rec, s.sent, s.firstAt = w, rec, rec.Chunks, time.Time{}
	s.pending = s.pending[:0]
}

// Header is the client response's header, sent already.
func (s *splice) Header() http.Header { return s.w.Header() }

// WriteHeader does nothing: the client's status went with the stream's
// first backend's.
func (s *splice) WriteHeader(int) {}

// Write takes events from the copier, whole or in parts, and writes each
// complete one rewritten.
func (s *splice) Write(b []byte) (int, error) {
	s.pending = append(s.pending, b...)
	s.out = s.out[:0]
	for {
		i := bytes.Index(s.pending, []byte("\n\n"))
		if i < 0 {
			break
		}
		s.out = s.event(s.out, s.pending[:i+2])
		s.pending = s.pending[:copy(s.pending, s.pending[i+2:])]
	}
	if len(s.out) == 0 {
		return len(b), nil
	}
	if _, err := s.w.Write(s.out); err != nil {
		return 0, err
	}
	return len(b), nil
}

// FlushError flushes the client's writer.
func (s *splice) FlushError() error { return sse.Flush(sse.FlusherOf(s.w)) }

// event appends the rewritten ev (one event with its blank line) to dst.
func (s *splice) event(dst, ev []byte) []byte {
	data, ok := bytes.CutPrefix(bytes.TrimRight(ev, "\r\n"), []byte("data:"))
	data = bytes.TrimLeft(data, " ")
	if !ok || !jsonscan.IsObject(data) {
		return append(dst, ev...) // [DONE], comments
	}
	var choices, usage []byte
	for m := range jsonscan.Members(data) {
		switch {
		case m.Is("choices"):
			choices = data[m.Val:m.End]
		case m.Is("usage"):
			usage = data[m.Val:m.End]
		}
	}
	content := carries(choices)
	if !content && !jsonscan.IsObject(usage) {
		return dst // the role announcement, or an empty chunk
	}
	if s.firstAt.IsZero() && content {
		// Its first token, or a finish with nothing more to say: either
		// way the client has had some of the continuation.
		s.firstAt = s.now()
	}
	dst = append(dst, "data: {"...)
	n := 0
	for m := range jsonscan.Members(data) {
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		dst = append(dst, data[m.Key:m.Val]...) // "name":
		v := data[m.Val:m.End]
		switch {
		case m.Is("id") && len(s.rec.ID) > 0:
			v = s.rec.ID
		case m.Is("created") && len(s.rec.Created) > 0:
			v = s.rec.Created
		case m.Is("model") && len(s.rec.Model) > 0:
			v = s.rec.Model
		case m.Is("usage") && jsonscan.IsObject(v):
			dst = s.usage(dst, v)
			continue
		}
		dst = append(dst, v...)
	}
	return append(dst, "}\n\n"...)
}

// usage appends the client's usage for the continuation's u: the prompt
// without the text sent before it, which the continuation's prompt
// holds, and that text's tokens among the completion's.
func (s *splice) usage(dst, u []byte) []byte {
	v, _ := sse.ParseUsage(u)
	prompt, completion := max(v.Prompt-s.sent, 0), v.Completion+s.sent
	dst = append(dst, `{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt+completion), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(completion), 10)
	if v.Cached >= 0 {
		dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
		dst = strconv.AppendInt(dst, int64(min(v.Cached, prompt)), 10)
		dst = append(dst, '}')
	}
	return append(dst, '}')
}

// carries reports whether a chunk's choices carry anything for the client:
// text or content, or a finish_reason.
func carries(choices []byte) bool {
	for c := range jsonscan.Elems(choices) {
		if f := jsonscan.Field(c, "finish_reason"); f != nil && !jsonscan.IsNull(f) {
			return true
		}
		if choiceText(c) {
			return true
		}
	}
	return false
}

// choiceText reports whether one choice carries text or content.
func choiceText(c []byte) bool {
	if jsonscan.NonEmpty(jsonscan.Field(c, "text")) {
		return true
	}
	return jsonscan.NonEmpty(jsonscan.Field(jsonscan.Field(c, "delta"), "content"))
}
