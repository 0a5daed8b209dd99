package emulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/tokenizer"
)

// maxBodyBytes bounds a request body. A full 128k-token context is well under
// 1 MiB of text or token ids.
const maxBodyBytes = 8 << 20

// streamOptions is the OpenAI stream_options object.
type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chatRequest is the part of an OpenAI chat completion request the emulator
// reads; other fields (temperature, tools, ...) are accepted and ignored.
// AddGenerationPrompt (default true) and ContinueFinalMessage are vLLM's
// chat template switches.
type chatRequest struct {
	Model                string         `json:"model"`
	Messages             []chatMessage  `json:"messages"`
	MaxTokens            *int           `json:"max_tokens"`
	MaxCompletionTokens  *int           `json:"max_completion_tokens"`
	N                    *int           `json:"n"`
	Stream               bool           `json:"stream"`
	StreamOptions        *streamOptions `json:"stream_options"`
	AddGenerationPrompt  *bool          `json:"add_generation_prompt"`
	ContinueFinalMessage bool           `json:"continue_final_message"`

	// KVTransferParams are vLLM's disaggregation parameters (disagg.go),
	// bootstrap SGLang's (bootstrap.go).
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	bootstrap
}

// chatMessage is one message; content is a string, an array of parts or null.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// completionRequest is the part of an OpenAI (legacy) completion request the
// emulator reads.
type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	N             *int            `json:"n"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	// KVTransferParams are vLLM's disaggregation parameters (disagg.go),
	// bootstrap SGLang's (bootstrap.go).
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	bootstrap
}

// chatRoles are the message roles the OpenAI chat API defines.
var chatRoles = map[string]bool{
	"system": true, "developer": true, "user": true, "assistant": true, "tool": true,
}

// decodeBody reads r's JSON body into v.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) *openai.Error {
	if r.ContentLength > maxBodyBytes {
		return tooLarge()
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return tooLarge()
		}
		return badRequest("", "could not read request body: %v", err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return badRequest("", "request body is empty: expected a JSON object")
	}
	if err := json.Unmarshal(data, v); err != nil {
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
			if te.Field == "" {
				return badRequest("", "request body must be a JSON object, not %s", te.Value)
			}
			return badRequest(te.Field, "invalid type for '%s': expected %s, got %s",
				te.Field, jsonType(te.Type), te.Value)
		}
		return badRequest("", "malformed JSON in request body: %v", err)
	}
	return nil
}

func tooLarge() *openai.Error {
	return &openai.Error{
		Status:  http.StatusRequestEntityTooLarge,
		Message: fmt.Sprintf("request body is larger than %d bytes", maxBodyBytes),
		Type:    openai.TypeInvalidRequest,
		Code:    "request_too_large",
	}
}

// jsonType names the JSON type that decodes into t.
func jsonType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return t.String()
}

// checkCommon validates the fields chat and completion requests share and
// returns the requested output length (nil: the natural length).
func checkCommon(n *int, limits ...namedLimit) (*int, *openai.Error) {
	if n != nil && *n != 1 {
		return nil, badRequest("n", "n = %d is not supported: the emulator returns exactly one choice", *n)
	}
	for _, l := range limits {
		if l.value == nil {
			continue
		}
		if *l.value < 1 {
			return nil, badRequest(l.name, "%s must be at least 1, got %d", l.name, *l.value)
		}
		return l.value, nil
	}
	return nil, nil
}

// namedLimit is an optional output-length field, by name.
type namedLimit struct {
	name  string
	value *int
}

// chatPrompt validates a chat request and renders its prompt tokens, and
// returns how many of them, at the end, are a reply under way: the content
// of a final assistant message that continue_final_message leaves open, as
// vLLM renders it (the template without the message's end of turn and with
// no generation prompt). The reply then goes on from there, so that a
// request continuing a cut reply gets exactly the rest of it (newCall).
func chatPrompt(req *chatRequest) (prompt []int32, pos int, e *openai.Error) {
	msgs, e := chatMessages(req.Messages)
	if e != nil {
		return nil, 0, e
	}
	addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	if !req.ContinueFinalMessage {
		return tokenizer.EncodeChat(nil, msgs, addGen), 0, nil
	}
	if addGen {
		// vLLM's check_generation_prompt.
		return nil, 0, badRequest("continue_final_message",
			"Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	last := msgs[len(msgs)-1]
	if last.Role != "assistant" {
		// An open message of another role: no reply under way.
		prompt = tokenizer.EncodeChat(nil, msgs[:len(msgs)-1], false)
		return tokenizer.EncodeOpen(prompt, last), 0, nil
	}
	prompt = tokenizer.EncodeChat(nil, msgs[:len(msgs)-1], true)
	n := len(prompt)
	prompt = tokenizer.Encode(prompt, last.Content)
	return prompt, len(prompt) - n, nil
}

// chatMessages validates a request's messages and returns their text.
func chatMessages(messages []chatMessage) ([]tokenizer.Message, *openai.Error) {
	req := struct{ Messages []chatMessage }{messages}
	if req.Messages == nil {
		return nil, badRequest("messages", "'messages' is a required property")
	}
	if len(req.Messages) == 0 {
		return nil, badRequest("messages", "'messages' must contain at least one message")
	}
	msgs := make([]tokenizer.Message, len(req.Messages))
	for i, m := range req.Messages {
		param := fmt.Sprintf("messages[%d]", i)
		if !chatRoles[m.Role] {
			if m.Role == "" {
				return nil, badRequest(param+".role", "%s.role is required", param)
			}
			return nil, badRequest(param+".role", "%s.role %q is not one of system, developer, user, assistant, tool", param, m.Role)
		}
		text, err := messageText(m, param)
		if err != nil {
			return nil, err
		}
		msgs[i] = tokenizer.Message{Role: m.Role, Content: text}
	}
	return msgs, nil
}

// messageText returns a message's content as one string. Text parts are
// joined with newlines, as vLLM does for string chat templates.
func messageText(m chatMessage, param string) (string, *openai.Error) {
	raw := bytes.TrimSpace(m.Content)
	if len(raw) == 0 || string(raw) == "null" {
		if m.Role == "assistant" { // an assistant turn that only called tools
			return "", nil
		}
		return "", badRequest(param+".content", "%s.content is required", param)
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", badRequest(param+".content", "%s.content: %v", param, err)
		}
		return s, nil
	case '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", badRequest(param+".content", "%s.content is not a valid array", param)
		}
		texts := make([]string, len(parts))
		for i, raw := range parts {
			var p struct {
				Type string  `json:"type"`
				Text *string `json:"text"`
			}
			part := fmt.Sprintf("%s.content[%d]", param, i)
			if json.Unmarshal(raw, &p) != nil {
				return "", badRequest(part, "%s must be an object with a string type and text", part)
			}
			if p.Type != "text" {
				return "", badRequest(part, "%s: content part type %q is not supported, only \"text\"", part, p.Type)
			}
			if p.Text == nil {
				return "", badRequest(part, "%s.text is required", part)
			}
			texts[i] = *p.Text
		}
		return strings.Join(texts, "\n"), nil
	}
	return "", badRequest(param+".content", "%s.content must be a string or an array of content parts", param)
}

// completionPrompt validates a completion prompt and returns its tokens: a
// string is encoded after a BOS token, as vLLM's Llama-3 tokenizer does;
// token ids are taken as they are.
func completionPrompt(raw json.RawMessage) ([]int32, *openai.Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt", "'prompt' is a required property")
	}
	text := func(s string) []int32 { return tokenizer.Encode([]int32{tokenizer.BOS}, s) }
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return text(s), nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) == 0 {
			return nil, badRequest("prompt", "prompt must not be empty")
		}
		if len(ss) != 1 {
			return nil, badRequest("prompt", "prompt must hold exactly one string, got %d: batched prompts are not supported", len(ss))
		}
		return text(ss[0]), nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		if len(ids) == 0 {
			return nil, badRequest("prompt", "prompt must not be empty")
		}
		toks := make([]int32, len(ids))
		for i, id := range ids {
			if id < 0 || id >= tokenizer.VocabSize {
				return nil, badRequest("prompt", "prompt[%d] = %d is not a token id in [0, %d)", i, id, tokenizer.VocabSize)
			}
			toks[i] = int32(id)
		}
		return toks, nil
	}
	return nil, badRequest("prompt", "prompt must be a string, an array of one string, or an array of token ids")
}
