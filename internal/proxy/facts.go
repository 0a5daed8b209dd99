package proxy

import (
	"encoding/json"
	"strconv"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/router"
)

// generation is what the proxy reads from the body of a chat or completion
// request: the router's facts and what forwarding needs to know.
type generation struct {
	req router.Request
	// stream is the request's "stream": true.
	stream bool
	// includeUsage is the request's stream_options.include_usage: true.
	includeUsage bool
}

// parseGeneration reads the body of a chat (endpointChat), completion
// (endpointCompletion) or Responses API (endpointResponses) request in one
// pass. session is the session header's value, which takes precedence over
// the body's keys (see sessionKey for their order).
func parseGeneration(ep endpoint, body []byte, session string) (*generation, *apiError) {
	obj, e := jsonObject(body)
	if e != nil {
		return nil, e
	}
	var model, messages, prompt, cacheKey, user, maxTokens, maxCompletion, stream, opts []byte
	var input, instructions, maxOutput, previous, safety, metadata []byte
	for m := range members(obj) {
		v := obj[m.val:m.end]
		switch {
		case m.is("model"):
			model = v
		case m.is("messages"):
			messages = v
		case m.is("prompt"):
			prompt = v
		case m.is("prompt_cache_key"):
			cacheKey = v
		case m.is("user"):
			user = v
		case m.is("max_tokens"):
			maxTokens = v
		case m.is("max_completion_tokens"):
			maxCompletion = v
		case m.is("stream"):
			stream = v
		case m.is("stream_options"):
			opts = v
		case m.is("input"):
			input = v
		case m.is("instructions"):
			instructions = v
		case m.is("max_output_tokens"):
			maxOutput = v
		case m.is("previous_response_id"):
			previous = v
		case m.is("safety_identifier"):
			safety = v
		case m.is("metadata"):
			metadata = v
		}
	}
	g := &generation{}
	if g.req.Model, e = modelName(model); e != nil {
		return nil, e
	}

	// The rendered prompt is about as long as the body: size it once.
	dst := make([]byte, 0, len(body))
	switch ep {
	case endpointChat:
		switch {
		case messages == nil || isNull(messages):
			return nil, openai.BadRequest("messages", "'messages' is a required property")
		case messages[0] != '[':
			return nil, openai.BadRequest("messages", "invalid type for 'messages': expected an array of messages")
		}
		dst, e = renderChat(dst, messages)
	case endpointResponses:
		dst, e = renderResponses(dst, instructions, input)
	default:
		if prompt == nil || isNull(prompt) {
			return nil, openai.BadRequest("prompt", "'prompt' is a required property")
		}
		dst = renderPrompt(dst, prompt)
	}
	if e != nil {
		return nil, e
	}
	// dst is not written again: the prompt is its bytes, not a copy of them
	// (as strings.Builder makes its string).
	g.req.Prompt = unsafe.String(unsafe.SliceData(dst), len(dst))

	if ep != endpointResponses {
		previous = nil // not a member of chat or completion requests
	}
	g.req.PreviousResponseID = stringValue(previous)
	g.req.SessionKey = sessionKey(session, cacheKey, previous, safety, user, metadata)
	g.req.MaxTokens = max(intValue(maxCompletion), 0)
	if g.req.MaxTokens == 0 {
		g.req.MaxTokens = max(intValue(maxTokens), 0)
	}
	if ep == endpointResponses {
		g.req.MaxTokens = max(intValue(maxOutput), 0)
	}
	g.stream = string(stream) == "true"
	g.includeUsage = string(field(opts, "include_usage")) == "true"
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
		if k := stringValue(v); k != "" {
			return k
		}
	}
	if isObject(metadata) {
		for _, name := range [...]string{"session_id", "conversation_id"} {
			if k := stringValue(field(metadata, name)); k != "" {
				return k
			}
		}
	}
	return ""
}

// jsonObject checks that body is one JSON object and returns it.
func jsonObject(body []byte) ([]byte, *apiError) {
	i := skipSpace(body, 0)
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
func modelName(v []byte) (string, *apiError) {
	switch {
	case v == nil || isNull(v):
		return "", openai.BadRequest("model", "'model' is a required property")
	case !isString(v):
		return "", openai.BadRequest("model", "invalid type for 'model': expected a string")
	}
	name := stringValue(v)
	if name == "" {
		return "", openai.BadRequest("model", "'model' must not be empty")
	}
	return name, nil
}

// bodyModel returns the "model" of a JSON object body, or "" if it has none.
// It serves the endpoints that are routed by model only when they name one.
func bodyModel(body []byte) string {
	i := skipSpace(body, 0)
	if i == len(body) || body[i] != '{' || !json.Valid(body) {
		return ""
	}
	return stringValue(field(body, "model"))
}

// renderChat appends the canonical text of a chat conversation to dst: for
// every message in order, its role (with its name and tool_call_id when
// present), a newline, its content (and any tool calls, as compact JSON), a
// newline. The result depends only on what the model sees, never on the
// body's layout or on other request fields, so the turns of one conversation
// render as prefixes of each other: what the router's prefix index needs.
func renderChat(dst, messages []byte) ([]byte, *apiError) {
	n := 0
	for msg := range elems(messages) {
		if !isObject(msg) {
			param := messageParam(n)
			return nil, openai.BadRequest(param, "invalid type for '%s': expected a message object", param)
		}
		var role, name, content, toolCalls, toolCallID, functionCall []byte
		for m := range members(msg) {
			v := msg[m.val:m.end]
			switch {
			case m.is("role"):
				role = v
			case m.is("name"):
				name = v
			case m.is("content"):
				content = v
			case m.is("tool_calls"):
				toolCalls = v
			case m.is("tool_call_id"):
				toolCallID = v
			case m.is("function_call"):
				functionCall = v
			}
		}
		if !isString(role) {
			param := messageParam(n)
			return nil, openai.BadRequest(param+".role", "'%s.role' is required and must be a string", param)
		}
		dst = appendString(dst, role)
		if isString(name) {
			dst = appendString(append(dst, " name="...), name)
		}
		if isString(toolCallID) {
			dst = appendString(append(dst, " tool_call_id="...), toolCallID)
		}
		dst = append(dst, '\n')
		start := len(dst)
		dst = appendContent(dst, content)
		for _, call := range [...][]byte{toolCalls, functionCall} {
			if nonEmpty(call) {
				if len(dst) > start {
					dst = append(dst, '\n')
				}
				dst = appendCompact(dst, call)
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
func renderResponses(dst, instructions, input []byte) ([]byte, *apiError) {
	switch {
	case isString(instructions):
		dst = append(dst, "system\n"...)
		dst = appendString(dst, instructions)
		dst = append(dst, '\n')
	case instructions != nil && !isNull(instructions):
		return nil, openai.BadRequest("instructions", "invalid type for 'instructions': expected a string")
	}
	switch {
	case input == nil || isNull(input):
		return dst, nil
	case isString(input):
		dst = append(dst, "user\n"...)
		dst = appendString(dst, input)
		return append(dst, '\n'), nil
	case input[0] != '[':
		return nil, openai.BadRequest("input", "invalid type for 'input': expected a string or an array of input items")
	}
	n := 0
	for item := range elems(input) {
		if !isObject(item) {
			param := "input[" + strconv.Itoa(n) + "]"
			return nil, openai.BadRequest(param, "invalid type for '%s': expected an input item object", param)
		}
		var typ, role, content []byte
		for m := range members(item) {
			v := item[m.val:m.end]
			switch {
			case m.is("type"):
				typ = v
			case m.is("role"):
				role = v
			case m.is("content"):
				content = v
			}
		}
		if isString(role) && (typ == nil || stringValue(typ) == "message") {
			dst = appendString(dst, role)
			dst = append(dst, '\n')
			dst = appendContent(dst, content)
			dst = append(dst, '\n')
		} else {
			if isString(typ) {
				dst = appendString(dst, typ)
			}
			dst = append(dst, '\n')
			dst = appendCompact(dst, item)
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
	case len(content) == 0 || isNull(content):
		return dst
	case isString(content):
		return appendString(dst, content)
	case content[0] != '[':
		return appendCompact(dst, content)
	}
	first := true
	for part := range elems(content) {
		if !first {
			dst = append(dst, '\n')
		}
		first = false
		if isString(part) {
			dst = appendString(dst, part)
			continue
		}
		if text := field(part, "text"); isString(text) {
			dst = appendString(dst, text)
			continue
		}
		// Compact the part in place to hash it, then replace it by the
		// digest.
		mark := len(dst)
		dst = appendCompact(dst, part)
		sum := xxhash.Sum64(dst[mark:])
		dst = dst[:mark]
		dst = append(dst, '<')
		dst = appendString(dst, field(part, "type"))
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
	case isString(prompt):
		return appendString(dst, prompt)
	case prompt[0] != '[':
		return appendCompact(dst, prompt)
	}
	// A first element that is a string or an array makes a batch.
	for el := range elems(prompt) {
		if isString(el) || el[0] == '[' {
			return renderPrompt(dst, el)
		}
		break
	}
	for el := range elems(prompt) {
		if intValue(el) < 0 {
			return appendCompact(dst, prompt)
		}
	}
	sep := false
	for el := range elems(prompt) {
		if sep {
			dst = append(dst, ' ')
		}
		dst = append(dst, el...)
		sep = true
	}
	return dst
}

// withIncludeUsage returns body with stream_options.include_usage set to
// true, changing nothing else: the member is inserted, or its value
// replaced, at the one place it belongs. It reports false and leaves body as
// it is when stream_options is neither absent, null nor an object (the
// backend will reject the request and the client should see why). body must
// be a valid JSON object.
func withIncludeUsage(body []byte) ([]byte, bool) {
	const set = `"include_usage":true`
	so, found := lookup(body, "stream_options")
	if !found {
		at := skipSpace(body, 0) + 1 // just inside the top-level '{'
		// Constants, not a concatenation: that would be an allocation
		// of its own for every streamed request.
		ins := `"stream_options":{` + set + `},`
		if body[skipSpace(body, at)] == '}' {
			ins = ins[:len(ins)-1]
		}
		return splice(body, at, at, ins), true
	}
	v := body[so.val:so.end]
	switch {
	case isNull(v):
		return splice(body, so.val, so.end, "{"+set+"}"), true
	case isObject(v):
		if iu, ok := lookup(v, "include_usage"); ok {
			return splice(body, so.val+iu.val, so.val+iu.end, "true"), true
		}
		ins := set + ","
		if v[skipSpace(v, 1)] == '}' {
			ins = ins[:len(ins)-1]
		}
		return splice(body, so.val+1, so.val+1, ins), true
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
