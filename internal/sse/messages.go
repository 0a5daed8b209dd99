package sse

import (
	"bytes"

	"github.com/kvroute/kvroute/internal/jsonscan"
)

// ParseMessagesUsage reads the Messages API's usage object: input_tokens
// (the prompt tokens not read from the cache, in Anthropic's API),
// cache_read_input_tokens, cache_creation_input_tokens and output_tokens.
// The prompt is their sum, as Anthropic bills it; the cached tokens are
// cache_read_input_tokens, unknown (-1) when the backend does not say (vLLM
// reports the whole prompt as input_tokens and no cache members). ok is
// false if v is not an object.
func ParseMessagesUsage(v []byte) (u Usage, ok bool) {
	if !jsonscan.IsObject(v) {
		return NoUsage, false
	}
	u = NoUsage
	read, created := -1, -1
	for m := range jsonscan.Members(v) {
		x := v[m.Val:m.End]
		if jsonscan.IsNull(x) {
			continue
		}
		switch {
		case m.Is("input_tokens"):
			u.Prompt = jsonscan.IntValue(x)
		case m.Is("cache_read_input_tokens"):
			read = jsonscan.IntValue(x)
		case m.Is("cache_creation_input_tokens"):
			created = jsonscan.IntValue(x)
		case m.Is("output_tokens"):
			u.Completion = jsonscan.IntValue(x)
		}
	}
	if u.Prompt >= 0 {
		u.Prompt += max(read, 0) + max(created, 0)
	}
	u.Cached = read
	return u, true
}

// isMessagesDelta reports whether a Messages API event of type typ (a raw
// JSON string) with the delta typ carries output: a content_block_delta
// (text, thinking, a tool's input JSON) with a non-empty delta.
func isMessagesDelta(typ, delta []byte) bool {
	return bytes.Equal(typ, []byte(`"content_block_delta"`)) && jsonscan.NonEmpty(delta)
}

// messagesUsage reads the usage of a Messages API event and reports
// whether data was one: message_start carries the message with its usage
// (the input tokens, and the cached ones where the backend counts them),
// message_delta the cumulative output tokens (and, from some backends, the
// input tokens again); what an event leaves out keeps its earlier value.
func (s *Scanner) messagesUsage(typ, msg, data []byte, use jsonscan.Member, hasUse bool) bool {
	var v []byte
	switch {
	case bytes.Equal(typ, []byte(`"message_start"`)):
		v = jsonscan.Field(msg, "usage")
	case bytes.Equal(typ, []byte(`"message_delta"`)):
		if hasUse {
			v = data[use.Val:use.End]
		}
	default:
		return false
	}
	u, ok := ParseMessagesUsage(v)
	if !ok {
		return true
	}
	if !s.SawUsage {
		s.Usage, s.SawUsage = NoUsage, true
	}
	if u.Prompt >= 0 {
		s.Usage.Prompt = u.Prompt
	}
	if u.Cached >= 0 {
		s.Usage.Cached = u.Cached
	}
	if u.Completion >= 0 {
		s.Usage.Completion = u.Completion
	}
	return true
}
