package sse

import (
	"errors"

	"github.com/kvroute/kvroute/internal/jsonscan"
)

// ErrErrorEvent is the read error of a copy that a backend's error event
// stopped (with Scanner.Rec): the backend failed mid-stream, and its event
// was not forwarded.
var ErrErrorEvent = errors.New("the backend sent an error event")

// Record is what a chat or completion stream sent to the client so far,
// for a stream that may have to continue on another backend: the chunks'
// id, created and model, the text of choice 0, how many chunks carried
// it, and whether what was sent can be continued at all. Scanner fills it
// as events pass; it may span several streams of one request (the
// original and its continuations), so its identity is the first one's. A
// Record is used on one goroutine at a time.
type Record struct {
	// ID, Created and Model are the raw JSON values of the first chunk's
	// members.
	ID, Created, Model []byte
	// Text is the text of choice 0 so far: completions' text, chat's
	// delta content.
	Text []byte
	// Chunks is how many chunks carried Text (one token each, as vLLM and
	// the emulator stream).
	Chunks int
	// Other is set when a chunk carried output that Text cannot carry on:
	// another choice, reasoning, a tool call, logprobs.
	Other bool
	// Finished is set once a chunk gave choice 0 its finish_reason.
	Finished bool
	// Failed holds the data of the backend's error event, once one came.
	Failed []byte
	// idBuf backs ID, Created and Model.
	idBuf []byte
}

// NewRecord returns an empty Record with room for the chunks' id, created
// and model and for a reply of about 250 tokens, so that recording most
// streams allocates nothing more.
func NewRecord() *Record {
	return &Record{Text: make([]byte, 0, 1024), idBuf: make([]byte, 0, 128)}
}

// keep copies v into r's identity buffer and returns the copy.
func (r *Record) keep(v []byte) []byte {
	n := len(r.idBuf)
	r.idBuf = append(r.idBuf, v...)
	return r.idBuf[n:len(r.idBuf):len(r.idBuf)]
}

// failed reports whether the backend's error event stopped the stream.
func (s *Scanner) failed() bool { return s.Rec != nil && s.Rec.Failed != nil }

// ident is what a chunk says of its stream beside its choices: its id,
// created and model, and whether it is an error.
type ident struct {
	id, created, model []byte
	failed             bool
}

// note reads m, a member of the chunk data.
func (d *ident) note(m jsonscan.Member, data []byte) {
	v := data[m.Val:m.End]
	switch {
	case m.Is("id"):
		d.id = v
	case m.Is("created"):
		d.created = v
	case m.Is("model"):
		d.model = v
	case m.Is("error"), m.Is("object") && string(v) == `"error"`:
		// {"error":{...}}, or vLLM's older {"object":"error",...}.
		d.failed = true
	}
}

// note records one chunk's data, whose members other than choices d
// holds, and reports whether it is the backend's error event.
func (r *Record) note(data []byte, d *ident, choices []byte) (failed bool) {
	if d.failed {
		r.Failed = append(r.Failed[:0], data...)
		return true
	}
	// Raw JSON values are never empty: an empty one is not yet seen.
	if len(r.ID) == 0 && d.id != nil {
		r.ID = r.keep(d.id)
	}
	if len(r.Created) == 0 && d.created != nil {
		r.Created = r.keep(d.created)
	}
	if len(r.Model) == 0 && d.model != nil {
		r.Model = r.keep(d.model)
	}
	for c := range jsonscan.Elems(choices) {
		r.choice(c)
	}
	return false
}

// choice records one element of a chunk's choices.
func (r *Record) choice(c []byte) {
	before := len(r.Text)
	for m := range jsonscan.Members(c) {
		v := c[m.Val:m.End]
		switch {
		case m.Is("index"):
			if jsonscan.IntValue(v) != 0 {
				r.Other = true
				return
			}
		case m.Is("text"):
			if jsonscan.IsString(v) {
				r.Text = jsonscan.AppendString(r.Text, v)
			}
		case m.Is("logprobs"):
			if !jsonscan.IsNull(v) {
				r.Other = true
			}
		case m.Is("finish_reason"):
			if !jsonscan.IsNull(v) {
				r.Finished = true
			}
		case m.Is("delta"):
			for d := range jsonscan.Members(v) {
				x := v[d.Val:d.End]
				switch {
				case d.Is("content"):
					if jsonscan.IsString(x) {
						r.Text = jsonscan.AppendString(r.Text, x)
					}
				case d.Is("reasoning_content"), d.Is("reasoning"), d.Is("tool_calls"), d.Is("function_call"):
					if jsonscan.NonEmpty(x) {
						r.Other = true
					}
				}
			}
		}
	}
	if len(r.Text) > before {
		r.Chunks++
	}
}
