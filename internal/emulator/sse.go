package emulator

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// events writes the server-sent events of one streamed response: chat and
// completion chunks (chunker) or Responses API events (responseEvents).
type events interface {
	// start appends what precedes the first token.
	start(dst []byte) []byte
	// token appends the event carrying one token's text.
	token(dst []byte, text string) []byte
	// end appends what follows the last token of c, whose output is done.
	end(dst []byte, c *call) []byte
}

// chunker writes the chunks of a streamed chat or completion. The fixed
// part of every chunk is encoded once, so a token costs one append of its
// text rather than a JSON encoding of a whole chunk.
type chunker struct {
	chat         bool
	includeUsage bool
	head         []byte // `data: {"id":…,"object":…,"created":…,"model":…,`
}

var _ events = (*chunker)(nil)

func newChunker(id, object string, created int64, model string, chat, includeUsage bool) *chunker {
	h := []byte(`data: {"id":`)
	h = appendJSONString(h, id)
	h = append(h, `,"object":`...)
	h = appendJSONString(h, object)
	h = append(h, `,"created":`...)
	h = strconv.AppendInt(h, created, 10)
	h = append(h, `,"model":`...)
	h = appendJSONString(h, model)
	h = append(h, ',')
	return &chunker{chat: chat, includeUsage: includeUsage, head: h}
}

// end appends the chunk with the finish reason, the usage chunk when the
// request asked for it, and [DONE].
func (k *chunker) end(dst []byte, c *call) []byte {
	dst = k.finish(dst, c.finishReason())
	if k.includeUsage {
		dst = k.usage(dst, c.usage())
	}
	return append(dst, "data: [DONE]\n\n"...)
}

// start appends what precedes the first token: for chat, the assistant role.
func (k *chunker) start(dst []byte) []byte {
	if !k.chat {
		return dst
	}
	dst = append(dst, k.head...)
	return append(dst, `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
}

// token appends the chunk carrying one token's text.
func (k *chunker) token(dst []byte, text string) []byte {
	dst = append(dst, k.head...)
	if k.chat {
		dst = append(dst, `"choices":[{"index":0,"delta":{"content":`...)
		dst = appendJSONString(dst, text)
		return append(dst, `},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
	}
	dst = append(dst, `"choices":[{"index":0,"text":`...)
	dst = appendJSONString(dst, text)
	return append(dst, `,"logprobs":null,"finish_reason":null,"stop_reason":null}]}`+"\n\n"...)
}

// finish appends the chunk with the finish reason.
func (k *chunker) finish(dst []byte, reason string) []byte {
	dst = append(dst, k.head...)
	if k.chat {
		dst = append(dst, `"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":`...)
	} else {
		dst = append(dst, `"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":`...)
	}
	dst = appendJSONString(dst, reason)
	return append(dst, `,"stop_reason":null}]}`+"\n\n"...)
}

// usage appends the final chunk of a stream with include_usage: no choices,
// the request's usage.
func (k *chunker) usage(dst []byte, u usage) []byte {
	data, _ := json.Marshal(u) // plain ints: cannot fail
	dst = append(dst, k.head...)
	dst = append(dst, `"choices":[],"usage":`...)
	dst = append(dst, data...)
	return append(dst, "}\n\n"...)
}

// appendJSONString appends s as a JSON string. Valid UTF-8 is copied as it
// is, with the characters JSON requires escaped.
func appendJSONString(dst []byte, s string) []byte {
	if !utf8.ValidString(s) {
		data, _ := json.Marshal(s) // replaces invalid bytes with U+FFFD
		return append(dst, data...)
	}
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		b := s[i]
		if b >= 0x20 && b != '"' && b != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch b {
		case '"', '\\':
			dst = append(dst, '\\', b)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
