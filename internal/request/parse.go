package request

import (
	"encoding/json"
	"strconv"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/jsonscan"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/router"
)

// Generation is what a router front reads from the body of a chat,
// completion or Responses API request: the routing facts, and whether the
// response streams and already carries its usage.
type Generation struct {
	// Request is the router's facts: model, session key, the canonical
	// prompt, max_tokens.
	Request router.Request
	// Stream is the request's "stream": true.
	Stream bool
	// IncludeUsage is the request's stream_options.include_usage: true.
	IncludeUsage bool
}

// Parse reads the body of a chat (Chat), completion (Completion) or
// Responses API (Responses) request in one pass. session is the session
// header's value, which takes precedence over the body's keys (see
// sessionKey for their order). The error is a 400 to answer the client
// with. It is one function so that the body's members are read in one
// pass, each noted where it is found.
func Parse(ep Endpoint, body []byte, session string) (*Generation, *openai.Error) {
	if ep == Messages {
		return parseMessages(body, session) // messages.go
	}
	obj, e := jsonObject(body)
	if e != nil {
		return nil, e
	}
	var model, messages, prompt, cacheKey, user, maxTokens, maxCompletion, stream, opts []byte
	var input, instructions, maxOutput, previous, safety, metadata []byte
	for m := range jsonscan.Members(obj) {
		v := obj[m.Val:m.End]
		switch {
		case m.Is("model"):
			model = v
		case m.Is("messages"):
			messages = v
		case m.Is("prompt"):
			prompt = v
		case m.Is("prompt_cache_key"):
			cacheKey = v
		case m.Is("user"):
			user = v
		case m.Is("max_tokens"):
			maxTokens = v
		case m.Is("max_completion_tokens"):
			maxCompletion = v
		case m.Is("stream"):
			stream = v
		case m.Is("stream_options"):
			opts = v
		case m.Is("input"):
			input = v
		case m.Is("instructions"):
			instructions = v
		case m.Is("max_output_tokens"):
			maxOutput = v
		case m.Is("previous_response_id"):
			previous = v
		case m.Is("safety_identifier"):
			safety = v
		case m.Is("metadata"):
			metadata = v
		}
	}
	g := &Generation{}
	if g.Request.Model, e = modelName(model); e != nil {
		return nil, e
	}

	// The rendered prompt is about as long as the body: size it once.
	dst := make([]byte, 0, len(body))
	switch ep {
	case Chat:
		switch {
		case messages == nil || jsonscan.IsNull(messages):
			return nil, openai.BadRequest("messages", "'messages' is a required property")
		case messages[0] != '[':
			return nil, openai.BadRequest("messages", "invalid type for 'messages': expected an array of messages")
		}
		dst, e = renderChat(dst, messages)
	case Responses:
		dst, e = renderResponses(dst, instructions, input)
	default:
		if prompt == nil || jsonscan.IsNull(prompt) {
			return nil, openai.BadRequest("prompt", "'prompt' is a required property")
		}
		dst = renderPrompt(dst, prompt)
	}
	if e != nil {
		return nil, e
	}
	// dst is not written again: the prompt is its bytes, not a copy of them
	// (as strings.Builder makes its string).
	g.Request.Prompt = unsafe.String(unsafe.SliceData(dst), len(dst))

	if ep != Responses {
		previous = nil // not a jsonscan.Member of chat or completion requests
	}
	g.Request.PreviousResponseID = jsonscan.StringValue(previous)
	g.Request.SessionKey = sessionKey(session, cacheKey, previous, safety, user, metadata)
	g.Request.MaxTokens = max(jsonscan.IntValue(maxCompletion), 0)
	if g.Request.MaxTokens == 0 {
		g.Request.MaxTokens = max(jsonscan.IntValue(maxTokens), 0)
	}
	if ep == Responses {
		g.Request.MaxTokens = max(jsonscan.IntValue(maxOutput), 0)
	}
	g.Stream = string(stream) == "true"
	g.IncludeUsage = string(jsonscan.Field(opts, "include_usage")) == "true"
	return g, nil
}

// sessionKey picks the key that groups a request with the other turns of
// its conversation, the first one present of: the session header; the
// body's prompt_cache_key (the client's own cache-affinity key); the
// Responses API's previous_response_id (the response this one continues,
// stored by the backend that produced it); safety_identifier (OpenAI's
// successor to user, hence before it); user; metadata.session_id;
// metadata.conversation_id. Members that are not non-empty strings are
// skipped.
func sessionKey(header string, cacheKey, previous, safety, user, metadata []byte) string {
	if header != "" {
		return header
	}
	for _, v := range [...][]byte{cacheKey, previous, safety, user} {
		if k := jsonscan.StringValue(v); k != "" {
			return k
		}
	}
	if jsonscan.IsObject(metadata) {
		for _, name := range [...]string{"session_id", "conversation_id"} {
			if k := jsonscan.StringValue(jsonscan.Field(metadata, name)); k != "" {
				return k
			}
		}
	}
	return ""
}

// jsonObject checks that body is one JSON object and returns it.
func jsonObject(body []byte) ([]byte, *openai.Error) {
	i := jsonscan.SkipSpace(body, 0)
	if i == len(body) {
		return nil, openai.BadRequest("", "request body is empty: expected a JSON object")
	}
	if !json.Valid(body) {
		var v any
		err := json.Unmarshal(body, &v) // only to say where and why
		return nil, openai.BadRequest("", "malformed JSON in request body: %v", err)
	}
	if body[i] != '{' {
		return nil, openai.BadRequest("", "request body must be a JSON object")
	}
	return body, nil
}

// modelName validates the "model" member's value v and returns the name.
func modelName(v []byte) (string, *openai.Error) {
	switch {
	case v == nil || jsonscan.IsNull(v):
		return "", openai.BadRequest("model", "'model' is a required property")
	case !jsonscan.IsString(v):
		return "", openai.BadRequest("model", "invalid type for 'model': expected a string")
	}
	name := jsonscan.StringValue(v)
	if name == "" {
		return "", openai.BadRequest("model", "'model' must not be empty")
	}
	return name, nil
}

// RequireModel returns the model named by body, which must be a JSON
// object with a non-empty string "model" (an embeddings request), or the
// 400 to answer the client with.
func RequireModel(body []byte) (string, *openai.Error) {
	obj, e := jsonObject(body)
	if e != nil {
		return "", e
	}
	return modelName(jsonscan.Field(obj, "model"))
}

// Model returns the "model" of a JSON object body, or "" if it has none.
// It serves the endpoints that are routed by model only when they name one.
func Model(body []byte) string {
	i := jsonscan.SkipSpace(body, 0)
	if i == len(body) || body[i] != '{' || !json.Valid(body) {
		return ""
	}
	return jsonscan.StringValue(jsonscan.Field(body, "model"))
}

// renderChat appends the canonical text of a chat conversation to dst: for
// every message in order, its role (with its name and tool_call_id when
// present), a newline, its content (and any tool calls, as compact JSON), a
// newline. The result depends only on what the model sees, never on the
// body's layout or on other request fields, so the turns of one conversation
// render as prefixes of each other: what the router's prefix index needs.
func renderChat(dst, messages []byte) ([]byte, *openai.Error) {
	n := 0
	for msg := range jsonscan.Elems(messages) {
		if !jsonscan.IsObject(msg) {
			param := messageParam(n)
			return nil, openai.BadRequest(param, "invalid type for '%s': expected a message object", param)
		}
		var role, name, content, toolCalls, toolCallID, functionCall []byte
		for m := range jsonscan.Members(msg) {
			v := msg[m.Val:m.End]
			switch {
			case m.Is("role"):
				role = v
			case m.Is("name"):
				name = v
			case m.Is("content"):
				content = v
			case m.Is("tool_calls"):
				toolCalls = v
			case m.Is("tool_call_id"):
				toolCallID = v
			case m.Is("function_call"):
				functionCall = v
			}
		}
		if !jsonscan.IsString(role) {
			param := messageParam(n)
			return nil, openai.BadRequest(param+".role", "'%s.role' is required and must be a string", param)
		}
		dst = jsonscan.AppendString(dst, role)
		if jsonscan.IsString(name) {
			dst = jsonscan.AppendString(append(dst, " name="...), name)
		}
		if jsonscan.IsString(toolCallID) {
			dst = jsonscan.AppendString(append(dst, " tool_call_id="...), toolCallID)
		}
		dst = append(dst, '\n')
		start := len(dst)
		dst = appendContent(dst, content)
		for _, call := range [...][]byte{toolCalls, functionCall} {
			if jsonscan.NonEmpty(call) {
				if len(dst) > start {
					dst = append(dst, '\n')
				}
				dst = jsonscan.AppendCompact(dst, call)
			}
		}
		dst = append(dst, '\n')
		n++
	}
	if n == 0 {
		return nil, openai.BadRequest("messages", "'messages' must contain at least one message")
	}
	return dst, nil
}

// renderResponses appends the canonical text of a Responses API request to
// dst, in the form of renderChat so that a conversation that moves from
// chat to responses keeps its prefix: instructions first as a system
// message; then input, a string as one user message, or a list of items:
// a message item ({"role", "content"}, with or without "type":"message") as
// its role, a newline, its content (a string, or parts whose texts —
// input_text, output_text, text — are joined by newlines and other parts
// digested, as appendContent does), a newline; any other item
// (function_call, function_call_output, reasoning, item_reference, ...) as
// its type, a newline, the item as compact JSON, a newline, so that it
// still counts in the prefix and differs where the model's input differs.
// A missing or null input renders nothing (a request may continue a stored
// response or a prompt template with none).
func renderResponses(dst, instructions, input []byte) ([]byte, *openai.Error) {
	switch {
	case jsonscan.IsString(instructions):
		dst = append(dst, "system\n"...)
		dst = jsonscan.AppendString(dst, instructions)
		dst = append(dst, '\n')
	case instructions != nil && !jsonscan.IsNull(instructions):
		return nil, openai.BadRequest("instructions", "invalid type for 'instructions': expected a string")
	}
	switch {
	case input == nil || jsonscan.IsNull(input):
		return dst, nil
	case jsonscan.IsString(input):
		dst = append(dst, "user\n"...)
		dst = jsonscan.AppendString(dst, input)
		return append(dst, '\n'), nil
	case input[0] != '[':
		return nil, openai.BadRequest("input", "invalid type for 'input': expected a string or an array of input items")
	}
	n := 0
	for item := range jsonscan.Elems(input) {
		if !jsonscan.IsObject(item) {
			param := "input[" + strconv.Itoa(n) + "]"
			return nil, openai.BadRequest(param, "invalid type for '%s': expected an input item object", param)
		}
		var typ, role, content []byte
		for m := range jsonscan.Members(item) {
			v := item[m.Val:m.End]
			switch {
			case m.Is("type"):
				typ = v
			case m.Is("role"):
				role = v
			case m.Is("content"):
				content = v
			}
		}
		if jsonscan.IsString(role) && (typ == nil || jsonscan.StringValue(typ) == "message") {
			dst = jsonscan.AppendString(dst, role)
			dst = append(dst, '\n')
			dst = appendContent(dst, content)
			dst = append(dst, '\n')
		} else {
			if jsonscan.IsString(typ) {
				dst = jsonscan.AppendString(dst, typ)
			}
			dst = append(dst, '\n')
			dst = jsonscan.AppendCompact(dst, item)
			dst = append(dst, '\n')
		}
		n++
	}
	return dst, nil
}

// messageParam names the n-th message in an error.
func messageParam(n int) string { return "messages[" + strconv.Itoa(n) + "]" }

// appendContent appends the text of a message's content: a string as it is;
// an array of parts as their texts joined by newlines (as vLLM joins them for
// string chat templates), with each non-text part (an image, audio, a file)
// as a short digest of its JSON, so that different images give different
// prompts without copying megabytes of base64 into the prompt.
func appendContent(dst, content []byte) []byte {
	switch {
	case len(content) == 0 || jsonscan.IsNull(content):
		return dst
	case jsonscan.IsString(content):
		return jsonscan.AppendString(dst, content)
	case content[0] != '[':
		return jsonscan.AppendCompact(dst, content)
	}
	first := true
	for part := range jsonscan.Elems(content) {
		if !first {
			dst = append(dst, '\n')
		}
		first = false
		if jsonscan.IsString(part) {
			dst = jsonscan.AppendString(dst, part)
			continue
		}
		if text := jsonscan.Field(part, "text"); jsonscan.IsString(text) {
			dst = jsonscan.AppendString(dst, text)
			continue
		}
		// Compact the part in place to hash it, then replace it by the
		// digest.
		mark := len(dst)
		dst = jsonscan.AppendCompact(dst, part)
		sum := xxhash.Sum64(dst[mark:])
		dst = dst[:mark]
		dst = append(dst, '<')
		dst = jsonscan.AppendString(dst, jsonscan.Field(part, "type"))
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, sum, 16)
		dst = append(dst, '>')
	}
	return dst
}

// renderPrompt appends the canonical text of a completion prompt to dst: a
// string as it is; token ids as decimal numbers separated by spaces; of a
// batch (an array of strings or of id arrays) the first prompt, which is the
// one whose prefix the backend will cache first. Anything else is rendered
// as compact JSON and left to the backend to judge.
func renderPrompt(dst, prompt []byte) []byte {
	switch {
	case jsonscan.IsString(prompt):
		return jsonscan.AppendString(dst, prompt)
	case prompt[0] != '[':
		return jsonscan.AppendCompact(dst, prompt)
	}
	// A first element that is a string or an array makes a batch.
	for el := range jsonscan.Elems(prompt) {
		if jsonscan.IsString(el) || el[0] == '[' {
			return renderPrompt(dst, el)
		}
		break
	}
	for el := range jsonscan.Elems(prompt) {
		if jsonscan.IntValue(el) < 0 {
			return jsonscan.AppendCompact(dst, prompt)
		}
	}
	sep := false
	for el := range jsonscan.Elems(prompt) {
		if sep {
			dst = append(dst, ' ')
		}
		dst = append(dst, el...)
		sep = true
	}
	return dst
}

// WithIncludeUsage returns body, a valid JSON object, with
// stream_options.include_usage set to true, changing nothing else: the
// member is inserted, or its value replaced, at the one place it belongs.
// Fronts send streamed requests so, for the backend to report the cached
// tokens the router learns from. It reports false, and returns body as it
// is, when stream_options is neither absent, null nor an object (the
// backend will reject the request and the client should see why).
func WithIncludeUsage(body []byte) ([]byte, bool) {
	const set = `"include_usage":true`
	so, found := jsonscan.Lookup(body, "stream_options")
	if !found {
		at := jsonscan.SkipSpace(body, 0) + 1 // just inside the top-level '{'
		// Constants, not a concatenation: that would be an allocation
		// of its own for every streamed request.
		ins := `"stream_options":{` + set + `},`
		if body[jsonscan.SkipSpace(body, at)] == '}' {
			ins = ins[:len(ins)-1]
		}
		return splice(body, at, at, ins), true
	}
	v := body[so.Val:so.End]
	switch {
	case jsonscan.IsNull(v):
		return splice(body, so.Val, so.End, "{"+set+"}"), true
	case jsonscan.IsObject(v):
		if iu, ok := jsonscan.Lookup(v, "include_usage"); ok {
			return splice(body, so.Val+iu.Val, so.Val+iu.End, "true"), true
		}
		ins := set + ","
		if v[jsonscan.SkipSpace(v, 1)] == '}' {
			ins = ins[:len(ins)-1]
		}
		return splice(body, so.Val+1, so.Val+1, ins), true
	}
	return body, false
}

// splice returns a new slice holding b with b[from:to] replaced by s.
func splice(b []byte, from, to int, s string) []byte {
	out := make([]byte, 0, len(b)-(to-from)+len(s))
	out = append(out, b[:from]...)
	out = append(out, s...)
	return append(out, b[to:]...)
}
