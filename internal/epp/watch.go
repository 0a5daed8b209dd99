package epp

import (
	"bytes"
	"encoding/json"
	"strings"
)

// maxLine bounds the part of one SSE line held across body chunks; a longer
// line is passed on without being read.
const maxLine = 1 << 20

// watcher reads a response body as it passes, chunk by chunk, for what the
// policy learns from: the first content, the content chunks, the usage;
// and, of a Responses API response, its id, which the router pins to the
// endpoint. It never changes the body.
type watcher struct {
	// sse is set for text/event-stream responses; others are one JSON
	// document, read at the end.
	sse bool
	// responses is set for a Responses API response: its id is read.
	responses  bool
	responseID string
	// messages is set for a Messages API response (messages.go).
	messages bool

	line     []byte // an SSE line not yet ended
	skipLine bool   // the current line grew past maxLine
	doc      []byte // a non-SSE body, up to responseBodyLimit
	docLong  bool

	// tokens counts the chunks that carried content.
	tokens int
	// usage is the last usage seen; prompt, cached and completion are -1
	// where it did not say.
	prompt, cached, completion int
	sawUsage                   bool
}

func newWatcher(sse bool) *watcher {
	return &watcher{sse: sse, prompt: -1, cached: -1, completion: -1}
}

// feed reads the next chunk of the body and reports whether the response
// has started giving the client what it asked for: for a stream, a chunk
// with content; otherwise any byte.
func (w *watcher) feed(b []byte) (content bool) {
	if !w.sse {
		if len(w.doc)+len(b) > responseBodyLimit {
			w.docLong, w.doc = true, nil
		}
		if !w.docLong {
			w.doc = append(w.doc, b...)
		}
		return len(b) > 0
	}
	before := w.tokens
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			w.keep(b)
			break
		}
		w.keep(b[:i])
		if !w.skipLine {
			w.event(w.line)
		}
		w.line, w.skipLine = w.line[:0], false
		b = b[i+1:]
	}
	return w.tokens > before
}

// keep adds part of a line to the one being read.
func (w *watcher) keep(b []byte) {
	if w.skipLine {
		return
	}
	if len(w.line)+len(b) > maxLine {
		w.skipLine, w.line = true, w.line[:0]
		return
	}
	w.line = append(w.line, b...)
}

// end reads what a non-streamed body said, once it has all arrived.
func (w *watcher) end() {
	if !w.sse && !w.docLong && len(w.doc) > 0 {
		var doc struct {
			ID    string     `json:"id"`
			Usage *usageJSON `json:"usage"`
		}
		if json.Unmarshal(w.doc, &doc) == nil && doc.Usage != nil {
			if w.messages {
				w.setMessagesUsage(doc.Usage)
			} else {
				w.setUsage(doc.Usage)
			}
		}
		if w.responses {
			w.responseID = doc.ID
		}
	}
}

// chunkJSON is what the watcher reads of an OpenAI streamed chunk, or of a
// Responses API event (type, delta, response).
type chunkJSON struct {
	Type     string          `json:"type"`
	Delta    json.RawMessage `json:"delta"`
	Response *struct {
		ID    string     `json:"id"`
		Usage *usageJSON `json:"usage"`
	} `json:"response"`

	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content          string          `json:"content"`
			ReasoningContent string          `json:"reasoning_content"`
			Reasoning        string          `json:"reasoning"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
			FunctionCall     json.RawMessage `json:"function_call"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *usageJSON `json:"usage"`
	// Message is a Messages API message_start's message.
	Message *struct {
		Usage *usageJSON `json:"usage"`
	} `json:"message"`
}

// usageJSON is a chat or completion usage (prompt_tokens, ...) or a
// Responses API one (input_tokens, ...).
type usageJSON struct {
	PromptTokens        *int        `json:"prompt_tokens"`
	CompletionTokens    *int        `json:"completion_tokens"`
	PromptTokensDetails *cachedJSON `json:"prompt_tokens_details"`
	InputTokens         *int        `json:"input_tokens"`
	OutputTokens        *int        `json:"output_tokens"`
	InputTokensDetails  *cachedJSON `json:"input_tokens_details"`
	// The Messages API's: input_tokens is then the part not read from the
	// cache.
	CacheReadInputTokens     *int `json:"cache_read_input_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens"`
}

type cachedJSON struct {
	CachedTokens *int `json:"cached_tokens"`
}

// event reads one SSE line: a data line with a chunk counts its content
// and keeps its usage; [DONE], comments and other fields are passed over.
func (w *watcher) event(line []byte) {
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return
	}
	var c chunkJSON
	if json.Unmarshal(data, &c) != nil {
		return
	}
	if w.messages {
		w.messagesEvent(&c) // messages.go
		return
	}
	for _, ch := range c.Choices {
		d := ch.Delta
		if ch.Text != "" || d.Content != "" || d.ReasoningContent != "" || d.Reasoning != "" ||
			nonEmpty(d.ToolCalls) || nonEmpty(d.FunctionCall) {
			w.tokens++
			break
		}
	}
	// A Responses API event: response.…delta with a delta carries output
	// (text, reasoning, refusal, arguments); the response object gives the
	// id (response.created first) and, at the end, the usage.
	if strings.HasPrefix(c.Type, "response.") && strings.HasSuffix(c.Type, ".delta") && nonEmpty(c.Delta) {
		w.tokens++
	}
	if r := c.Response; r != nil {
		if w.responses && w.responseID == "" {
			w.responseID = r.ID
		}
		if r.Usage != nil {
			w.setUsage(r.Usage)
		}
	}
	if c.Usage != nil {
		w.setUsage(c.Usage)
	}
}

func (w *watcher) setUsage(u *usageJSON) {
	w.sawUsage = true
	w.prompt, w.cached, w.completion = -1, -1, -1
	for _, v := range []struct {
		dst *int
		src *int
	}{{&w.prompt, u.PromptTokens}, {&w.prompt, u.InputTokens}, {&w.completion, u.CompletionTokens}, {&w.completion, u.OutputTokens}} {
		if v.src != nil {
			*v.dst = *v.src
		}
	}
	for _, d := range []*cachedJSON{u.PromptTokensDetails, u.InputTokensDetails} {
		if d != nil && d.CachedTokens != nil {
			w.cached = *d.CachedTokens
		}
	}
}

// nonEmpty reports whether a JSON value says something: not absent, null,
// an empty array or an empty object.
func nonEmpty(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	switch string(v) {
	case "", "null", "[]", "{}", `""`:
		return false
	}
	return true
}
