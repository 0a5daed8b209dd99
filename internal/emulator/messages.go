package emulator

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/internal/anthropic"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/tokenizer"
)

// Anthropic's Messages API (POST /v1/messages), as vLLM serves it: the
// request becomes a chat conversation (the system prompt, string or text
// blocks, first; a message's blocks as text), is answered by the same
// engine, and the answer is an Anthropic message; a stream is
// message_start, content_block_start, a content_block_delta per token,
// content_block_stop, message_delta (the stop reason and the usage) and
// message_stop, each with its `event:` line. Usage counts as Anthropic's
// API does: input_tokens is the prompt not read from the prefix cache,
// cache_read_input_tokens what was (vLLM reports neither split; kvroute
// reads both forms, docs/decisions/0017-messages-api.md). Errors on the path
// are in Anthropic's shape. POST /v1/messages/count_tokens counts a
// request's prompt.

// messagesRequest is the part of a Messages API request the emulator
// reads.
type messagesRequest struct {
	Model     string            `json:"model"`
	System    json.RawMessage   `json:"system"`
	Messages  []messagesMessage `json:"messages"`
	Tools     json.RawMessage   `json:"tools"`
	MaxTokens *int              `json:"max_tokens"`
	Stream    bool              `json:"stream"`
}

type messagesMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// messagesWriter marks the writer of a Messages API request: writeError
// answers in Anthropic's shape through it.
type messagesWriter struct{ http.ResponseWriter }

// Unwrap is for http.ResponseController.
func (m messagesWriter) Unwrap() http.ResponseWriter { return m.ResponseWriter }

// errorEvent appends the event that reports e in a stream under way: on the
// Messages API Anthropic's error event, else OpenAI's and [DONE].
func errorEvent(w http.ResponseWriter, dst []byte, e *openai.Error) []byte {
	if _, ok := w.(messagesWriter); ok {
		return anthropic.AppendEvent(dst, e)
	}
	return append(e.AppendEvent(dst), "data: [DONE]\n\n"...)
}

func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	f := s.Faults()
	if s.beforeHeaders(w, r, &f) {
		return
	}
	var req messagesRequest
	if e := decodeBody(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	if req.MaxTokens == nil {
		writeError(w, badRequest("max_tokens", "max_tokens: Field required"))
		return
	}
	if *req.MaxTokens <= 0 {
		writeError(w, badRequest("max_tokens", "max_tokens must be positive"))
		return
	}
	x, e := s.prepare(req.Model, nil, req.Stream, nil, true, namedLimit{"max_tokens", req.MaxTokens})
	if e != nil {
		writeError(w, e)
		return
	}
	conv, e := messagesConversation(&req)
	if e != nil {
		writeError(w, e)
		return
	}
	x.id, x.messages, x.faults = "msg_"+randomHex(), true, f
	x.events = &messageEvents{s: s, x: x}
	s.serve(w, r, x, tokenizer.EncodeChat(nil, conv, true), 0, "messages")
}

// handleCountTokens answers POST /v1/messages/count_tokens with the
// prompt's length, as vLLM does.
func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	var req messagesRequest
	if e := decodeBody(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	if req.Model != "" && req.Model != s.model && s.adapter(req.Model) == 0 {
		writeError(w, modelNotFound(req.Model))
		return
	}
	conv, e := messagesConversation(&req)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"input_tokens": len(tokenizer.EncodeChat(nil, conv, true))})
}

// messagesConversation renders a request as chat messages, as vLLM
// converts it: the system prompt (and the tools, which a chat template
// puts before the conversation) as a system message, then each message
// with its blocks as text (messagesText).
func messagesConversation(req *messagesRequest) ([]tokenizer.Message, *openai.Error) {
	if len(req.Messages) == 0 {
		return nil, badRequest("messages", "messages must contain at least one item")
	}
	var system []string
	if sys := bytes.TrimSpace(req.System); len(sys) > 0 && string(sys) != "null" {
		text, ok := messagesText(sys)
		if !ok {
			return nil, badRequest("system", "system must be a string or a list of text blocks")
		}
		system = append(system, text)
	}
	if tools := bytes.TrimSpace(req.Tools); len(tools) > 0 && string(tools) != "null" && string(tools) != "[]" {
		var compact bytes.Buffer
		if json.Compact(&compact, tools) != nil || tools[0] != '[' {
			return nil, badRequest("tools", "tools must be a list")
		}
		system = append(system, compact.String())
	}
	var conv []tokenizer.Message
	if len(system) > 0 {
		conv = append(conv, tokenizer.Message{Role: "system", Content: strings.Join(system, "\n")})
	}
	for i, m := range req.Messages {
		param := "messages[" + strconv.Itoa(i) + "]"
		if m.Role != "user" && m.Role != "assistant" && m.Role != "system" {
			return nil, badRequest(param+".role", "%s.role must be user or assistant", param)
		}
		text, ok := messagesText(m.Content)
		if !ok {
			return nil, badRequest(param+".content", "%s.content must be a string or a list of content blocks", param)
		}
		conv = append(conv, tokenizer.Message{Role: m.Role, Content: text})
	}
	return conv, nil
}

// messagesText is the text of a content: a string, or its blocks joined by
// newlines — text and thinking as their text, a tool result as its
// content's text, anything else (tool_use, an image) as its JSON.
func messagesText(raw json.RawMessage) (string, bool) {
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return text, true
	}
	var blocks []json.RawMessage
	if json.Unmarshal(raw, &blocks) != nil {
		return "", false
	}
	parts := make([]string, 0, len(blocks))
	for _, b := range blocks {
		var blk struct {
			Type     string          `json:"type"`
			Text     *string         `json:"text"`
			Thinking *string         `json:"thinking"`
			Content  json.RawMessage `json:"content"`
		}
		if json.Unmarshal(b, &blk) != nil {
			return "", false
		}
		switch {
		case blk.Type == "text" && blk.Text != nil:
			parts = append(parts, *blk.Text)
		case blk.Type == "thinking" && blk.Thinking != nil:
			parts = append(parts, *blk.Thinking)
		case blk.Type == "tool_result":
			t, _ := messagesText(blk.Content)
			parts = append(parts, t)
		default:
			var compact bytes.Buffer
			_ = json.Compact(&compact, b) // it unmarshalled: valid
			parts = append(parts, compact.String())
		}
	}
	return strings.Join(parts, "\n"), true
}

// messageObject is a Messages API message, as Anthropic and vLLM send it.
type messageObject struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Content      []messageBlock `json:"content"`
	Model        string         `json:"model"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        messageUsage   `json:"usage"`
}

type messageBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type messageUsage struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
}

// messageUsageOf is c's usage in Anthropic's terms; output is the output
// tokens so far.
func messageUsageOf(c *call, output int) messageUsage {
	return messageUsage{InputTokens: c.req.PromptLen - c.cached, CacheReadInputTokens: c.cached, OutputTokens: output}
}

// stopReason is the Messages API's name of c's finish reason.
func stopReason(c *call) *string {
	r := "max_tokens"
	if c.stop {
		r = "end_turn"
	}
	return &r
}

// message is x's message: at its start (c's output not yet done) with no
// content and no stop reason, else whole.
func (s *Server) message(x *exchange, c *call, done bool) *messageObject {
	m := &messageObject{ID: x.id, Type: "message", Role: "assistant", Content: []messageBlock{}, Model: x.model}
	if !done {
		m.Usage = messageUsageOf(c, 0)
		return m
	}
	m.Content = []messageBlock{{Type: "text", Text: strings.Join(c.pieces, "")}}
	m.StopReason = stopReason(c)
	m.Usage = messageUsageOf(c, c.total)
	return m
}

// messageEvents writes a Messages API stream.
type messageEvents struct {
	s *Server
	x *exchange
}

var _ events = (*messageEvents)(nil)

func (e *messageEvents) event(dst []byte, typ string, fields map[string]any) []byte {
	fields["type"] = typ
	data, _ := json.Marshal(fields) // our own values: cannot fail
	dst = append(dst, "event: "+typ+"\ndata: "...)
	dst = append(dst, data...)
	return append(dst, "\n\n"...)
}

// start is called once the first token is out: the prefill, and so the
// cached tokens, are known.
func (e *messageEvents) start(dst []byte) []byte {
	dst = e.event(dst, "message_start", map[string]any{"message": e.s.message(e.x, e.x.call, false)})
	return e.event(dst, "content_block_start", map[string]any{"index": 0, "content_block": messageBlock{Type: "text"}})
}

func (e *messageEvents) token(dst []byte, text string) []byte {
	dst = append(dst, `event: content_block_delta`+"\n"+`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":`...)
	dst = appendJSONString(dst, text)
	return append(dst, "}}\n\n"...)
}

func (e *messageEvents) end(dst []byte, c *call) []byte {
	dst = e.event(dst, "content_block_stop", map[string]any{"index": 0})
	dst = e.event(dst, "message_delta", map[string]any{
		"delta": map[string]any{"stop_reason": stopReason(c), "stop_sequence": nil},
		"usage": messageUsageOf(c, c.total)})
	return e.event(dst, "message_stop", map[string]any{})
}
