package request

import (
	"bytes"
	"strconv"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/jsonscan"
	"github.com/kvroute/kvroute/internal/openai"
)

// billingHeader starts a system text block that Claude Code sends with a
// per-request hash; vLLM leaves it out of the prompt so that it does not
// defeat prefix caching, and so does the rendering here.
const billingHeader = "x-anthropic-billing-header"

// parseMessages reads the body of an Anthropic Messages API request
// (POST /v1/messages): model, max_tokens (required by the API, and the
// output estimate), stream, the session key (the session header, else
// metadata.user_id) and the prompt rendered by renderMessages.
func parseMessages(body []byte, session string) (*Generation, *openai.Error) {
	obj, e := jsonObject(body)
	if e != nil {
		return nil, e
	}
	var model, system, messages, tools, maxTokens, stream, metadata []byte
	for m := range jsonscan.Members(obj) {
		v := obj[m.Val:m.End]
		switch {
		case m.Is("model"):
			model = v
		case m.Is("system"):
			system = v
		case m.Is("messages"):
			messages = v
		case m.Is("tools"):
			tools = v
		case m.Is("max_tokens"):
			maxTokens = v
		case m.Is("stream"):
			stream = v
		case m.Is("metadata"):
			metadata = v
		}
	}
	g := &Generation{}
	if g.Request.Model, e = modelName(model); e != nil {
		return nil, e
	}
	switch {
	case maxTokens == nil || jsonscan.IsNull(maxTokens):
		return nil, openai.BadRequest("max_tokens", "max_tokens: Field required")
	case jsonscan.IntValue(maxTokens) < 1 || bytes.ContainsAny(maxTokens, ".eE"):
		return nil, openai.BadRequest("max_tokens", "max_tokens: must be a positive integer")
	}
	g.Request.MaxTokens = jsonscan.IntValue(maxTokens)
	switch {
	case messages == nil || jsonscan.IsNull(messages):
		return nil, openai.BadRequest("messages", "messages: Field required")
	case messages[0] != '[':
		return nil, openai.BadRequest("messages", "messages: Input should be a valid list")
	}
	dst, e := renderMessages(make([]byte, 0, len(body)), system, tools, messages)
	if e != nil {
		return nil, e
	}
	// dst is not written again: the prompt is its bytes, as in Parse.
	g.Request.Prompt = unsafe.String(unsafe.SliceData(dst), len(dst))
	g.Request.SessionKey = session
	if session == "" && jsonscan.IsObject(metadata) {
		g.Request.SessionKey = jsonscan.StringValue(jsonscan.Field(metadata, "user_id"))
	}
	g.Stream = string(stream) == "true"
	return g, nil
}

// renderMessages appends the canonical text of a Messages API request to
// dst, in renderChat's form so that a conversation that moves between chat
// and messages keeps its prefix: the system prompt first as a system
// message (a string, or its text blocks joined by newlines, Claude Code's
// billing header left out as vLLM leaves it); then the tools, as "tools"
// and each tool's name, description and input schema (what the chat
// template puts before the conversation, cache_control left out); then
// every message as its role, a newline, its content (renderBlocks), a
// newline. Turn N+1 of a conversation renders turn N's text as its prefix
// wherever a client moves its cache_control marks.
func renderMessages(dst, system, tools, messages []byte) ([]byte, *openai.Error) {
	switch {
	case system == nil || jsonscan.IsNull(system):
	case jsonscan.IsString(system):
		dst = append(dst, "system\n"...)
		dst = jsonscan.AppendString(dst, system)
		dst = append(dst, '\n')
	case system[0] == '[':
		dst = append(dst, "system\n"...)
		first := true
		for block := range jsonscan.Elems(system) {
			text := jsonscan.Field(block, "text")
			if !jsonscan.IsString(text) || bytes.HasPrefix(text[1:], []byte(billingHeader)) {
				continue
			}
			if !first {
				dst = append(dst, '\n')
			}
			first = false
			dst = jsonscan.AppendString(dst, text)
		}
		dst = append(dst, '\n')
	default:
		return nil, openai.BadRequest("system", "system: Input should be a valid string or a list of text blocks")
	}
	switch {
	case tools == nil || jsonscan.IsNull(tools) || jsonscan.IsEmptyArray(tools):
	case tools[0] == '[':
		dst = append(dst, "tools\n"...)
		for tool := range jsonscan.Elems(tools) {
			dst = appendTool(dst, tool)
			dst = append(dst, '\n')
		}
	default:
		return nil, openai.BadRequest("tools", "tools: Input should be a valid list")
	}
	n := 0
	for msg := range jsonscan.Elems(messages) {
		if !jsonscan.IsObject(msg) {
			param := messageParam(n)
			return nil, openai.BadRequest(param, "%s: Input should be a valid dictionary", param)
		}
		role, content := jsonscan.Field(msg, "role"), jsonscan.Field(msg, "content")
		switch {
		case !jsonscan.IsString(role):
			param := messageParam(n)
			return nil, openai.BadRequest(param+".role", "%s.role: Field required", param)
		case content == nil || !jsonscan.IsString(content) && content[0] != '[':
			param := messageParam(n)
			return nil, openai.BadRequest(param+".content", "%s.content: Input should be a string or a list of content blocks", param)
		}
		dst = jsonscan.AppendString(dst, role)
		dst = append(dst, '\n')
		dst = renderBlocks(dst, content)
		dst = append(dst, '\n')
		n++
	}
	if n == 0 {
		return nil, openai.BadRequest("messages", "messages: must contain at least one message")
	}
	return dst, nil
}

// appendTool appends a tool definition: a custom tool as its name, a
// newline, its description, a newline, its input schema as compact JSON; a
// server tool (no input_schema) as compact JSON. Members a client changes
// from turn to turn (cache_control) are not read.
func appendTool(dst, tool []byte) []byte {
	schema := jsonscan.Field(tool, "input_schema")
	if !jsonscan.IsObject(schema) {
		return jsonscan.AppendCompact(dst, tool)
	}
	dst = jsonscan.AppendString(dst, jsonscan.Field(tool, "name"))
	dst = append(dst, '\n')
	if d := jsonscan.Field(tool, "description"); jsonscan.IsString(d) {
		dst = jsonscan.AppendString(dst, d)
	}
	dst = append(dst, '\n')
	return jsonscan.AppendCompact(dst, schema)
}

// renderBlocks appends a message's content: a string as it is; content
// blocks joined by newlines, each as the model sees it — text and thinking
// as their text; tool_use as "tool_use", its name and id, a newline, its
// input as compact JSON; tool_result as "tool_result", the tool_use_id
// (and is_error), a newline, its content rendered the same way; anything
// else (image, document, redacted_thinking) as a short digest of its JSON,
// as appendContent digests parts that are not text. cache_control, which
// clients move to the latest block each turn, is never read.
func renderBlocks(dst, content []byte) []byte {
	if jsonscan.IsString(content) {
		return jsonscan.AppendString(dst, content)
	}
	if len(content) == 0 || content[0] != '[' {
		return dst
	}
	first := true
	for block := range jsonscan.Elems(content) {
		if !first {
			dst = append(dst, '\n')
		}
		first = false
		if jsonscan.IsString(block) {
			dst = jsonscan.AppendString(dst, block)
			continue
		}
		// The raw string, compared without decoding (no allocation): block
		// types are plain ASCII names, and an escaped one is digested.
		switch string(jsonscan.Field(block, "type")) {
		case `"text"`:
			dst = jsonscan.AppendString(dst, jsonscan.Field(block, "text"))
		case `"thinking"`:
			dst = jsonscan.AppendString(dst, jsonscan.Field(block, "thinking"))
		case `"tool_use"`:
			dst = append(dst, "tool_use "...)
			dst = jsonscan.AppendString(dst, jsonscan.Field(block, "name"))
			dst = append(dst, " id="...)
			dst = jsonscan.AppendString(dst, jsonscan.Field(block, "id"))
			dst = append(dst, '\n')
			if in := jsonscan.Field(block, "input"); in != nil {
				dst = jsonscan.AppendCompact(dst, in)
			}
		case `"tool_result"`:
			dst = append(dst, "tool_result tool_use_id="...)
			dst = jsonscan.AppendString(dst, jsonscan.Field(block, "tool_use_id"))
			if string(jsonscan.Field(block, "is_error")) == "true" {
				dst = append(dst, " is_error"...)
			}
			dst = append(dst, '\n')
			dst = renderBlocks(dst, jsonscan.Field(block, "content"))
		default:
			dst = appendDigest(dst, block)
		}
	}
	return dst
}

// appendDigest appends a block that is not text as "<type hash>", the form
// appendContent gives an image part: different images give different
// prompts without copying their base64 into the prompt.
func appendDigest(dst, block []byte) []byte {
	mark := len(dst)
	dst = jsonscan.AppendCompact(dst, block)
	sum := xxhash.Sum64(dst[mark:])
	dst = dst[:mark]
	dst = append(dst, '<')
	dst = jsonscan.AppendString(dst, jsonscan.Field(block, "type"))
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, sum, 16)
	return append(dst, '>')
}
