package emulator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/tokenizer"
)

// The Responses API (POST /v1/responses), as vLLM serves it: the input
// (a string or message items) after the instructions, continuing the
// conversation of previous_response_id, which only the server that
// produced that response has stored (vLLM keeps them in memory; an id it
// does not hold is a 404). A stream is typed events: response.created
// (with the response's id), response.output_text.delta per token,
// response.completed (with the usage); no [DONE].

// maxStoredResponses bounds the conversations the emulator keeps for
// previous_response_id, oldest forgotten first, so that a long benchmark
// does not grow without end (vLLM's store is unbounded).
const maxStoredResponses = 10_000

// responsesRequest is the part of a Responses API request the emulator
// reads.
type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	PreviousResponseID *string         `json:"previous_response_id"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	Store              *bool           `json:"store"`
}

// responseStore holds the responses produced, by id: the response object
// and its conversation (input and output, as chat messages). Safe for
// concurrent use.
type responseStore struct {
	mu    sync.Mutex
	byID  map[string]storedResponse
	order []string // ids, oldest first
}

type storedResponse struct {
	obj  *responseObject
	conv []tokenizer.Message
}

func (st *responseStore) get(id string) (storedResponse, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	r, ok := st.byID[id]
	return r, ok
}

func (st *responseStore) put(id string, r storedResponse) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.byID == nil {
		st.byID = map[string]storedResponse{}
	}
	if len(st.order) >= maxStoredResponses {
		delete(st.byID, st.order[0])
		st.order = st.order[1:]
	}
	st.byID[id] = r
	st.order = append(st.order, id)
}

// handleStoredResponse answers GET /v1/responses/{id}: the response, as
// it was returned, if this server produced it and stores it.
func (s *Server) handleStoredResponse(w http.ResponseWriter, id string) {
	r, ok := s.responses.get(id)
	if !ok {
		writeError(w, responseNotFound(id, ""))
		return
	}
	writeJSON(w, http.StatusOK, r.obj)
}

// responseNotFound is vLLM's answer for a response id it does not hold.
func responseNotFound(id, param string) *openai.Error {
	return &openai.Error{Status: http.StatusNotFound, Type: openai.TypeInvalidRequest, Param: param,
		Code: "response_not_found", Message: fmt.Sprintf("Response with id '%s' not found.", id)}
}

func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	f := s.Faults()
	if s.beforeHeaders(w, r, &f) {
		return
	}
	var req responsesRequest
	if e := decodeBody(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	x, e := s.prepare(req.Model, nil, req.Stream, nil, true, namedLimit{"max_output_tokens", req.MaxOutputTokens})
	if e != nil {
		writeError(w, e)
		return
	}
	conv, e := s.responsesConversation(&req)
	if e != nil {
		writeError(w, e)
		return
	}
	x.id, x.responses, x.faults = "resp_"+randomHex(), true, f
	x.events = &responseEvents{s: s, x: x}
	if req.Store == nil || *req.Store {
		x.done = func(c *call) {
			s.responses.put(x.id, storedResponse{obj: s.response(x, c, true),
				conv: append(conv, tokenizer.Message{Role: "assistant", Content: strings.Join(c.pieces, "")})})
		}
	}
	s.serve(w, r, x, tokenizer.EncodeChat(nil, conv, true), 0, "input")
}

// responsesConversation renders a request as chat messages: the
// instructions as a system message, the stored conversation it continues,
// then its input.
func (s *Server) responsesConversation(req *responsesRequest) ([]tokenizer.Message, *openai.Error) {
	var conv []tokenizer.Message
	if req.Instructions != nil && *req.Instructions != "" {
		conv = append(conv, tokenizer.Message{Role: "system", Content: *req.Instructions})
	}
	if id := req.PreviousResponseID; id != nil && *id != "" {
		stored, ok := s.responses.get(*id)
		if !ok {
			return nil, responseNotFound(*id, "previous_response_id")
		}
		prev := stored.conv
		// The stored conversation starts with its own instructions; this
		// request's, if any, replace them (as OpenAI's do).
		if len(conv) > 0 && len(prev) > 0 && prev[0].Role == "system" {
			prev = prev[1:]
		}
		conv = append(conv, prev...)
	}
	input, e := responsesInput(req.Input)
	if e != nil {
		return nil, e
	}
	conv = append(conv, input...)
	if len(conv) == 0 {
		return nil, badRequest("input", "'input' is required")
	}
	return conv, nil
}

// responsesInput reads the input: a string (one user message) or a list
// of message items, whose content is a string or parts with text
// (input_text, output_text, text).
func responsesInput(raw json.RawMessage) ([]tokenizer.Message, *openai.Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return []tokenizer.Message{{Role: "user", Content: text}}, nil
	}
	var items []struct {
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &items) != nil {
		return nil, badRequest("input", "'input' must be a string or an array of input items")
	}
	var msgs []tokenizer.Message
	for i, it := range items {
		param := "input[" + strconv.Itoa(i) + "]"
		if it.Type != "" && it.Type != "message" || !chatRoles[it.Role] {
			return nil, badRequest(param, "%s: only message items with a role are supported by the emulator", param)
		}
		var s string
		if json.Unmarshal(it.Content, &s) != nil {
			var parts []struct {
				Text *string `json:"text"`
			}
			if json.Unmarshal(it.Content, &parts) != nil {
				return nil, badRequest(param+".content", "%s.content must be a string or an array of content parts", param)
			}
			var texts []string
			for _, p := range parts {
				if p.Text != nil {
					texts = append(texts, *p.Text)
				}
			}
			s = strings.Join(texts, "\n")
		}
		msgs = append(msgs, tokenizer.Message{Role: it.Role, Content: s})
	}
	return msgs, nil
}

// responseObject is a Responses API response, as vLLM and OpenAI send it.
type responseObject struct {
	ID                 string           `json:"id"`
	Object             string           `json:"object"`
	CreatedAt          int64            `json:"created_at"`
	Model              string           `json:"model"`
	Status             string           `json:"status"`
	Output             []responseOutput `json:"output"`
	PreviousResponseID *string          `json:"previous_response_id"`
	Usage              *responseUsage   `json:"usage"`
}

type responseOutput struct {
	Type    string            `json:"type"`
	ID      string            `json:"id"`
	Status  string            `json:"status"`
	Role    string            `json:"role"`
	Content []responseContent `json:"content"`
}

type responseContent struct {
	Type        string   `json:"type"`
	Text        string   `json:"text"`
	Annotations []string `json:"annotations"`
}

type responseUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// response is the response object of x, in progress or (done) with its
// output and usage.
func (s *Server) response(x *exchange, c *call, done bool) *responseObject {
	o := &responseObject{ID: x.id, Object: "response", CreatedAt: x.created, Model: x.model, Status: "in_progress",
		Output: []responseOutput{}}
	if !done {
		return o
	}
	o.Status = "completed"
	o.Output = []responseOutput{{Type: "message", ID: "msg_" + x.id[len("resp_"):], Status: "completed", Role: "assistant",
		Content: []responseContent{{Type: "output_text", Text: strings.Join(c.pieces, ""), Annotations: []string{}}}}}
	u := &responseUsage{InputTokens: c.req.PromptLen, OutputTokens: c.total, TotalTokens: c.req.PromptLen + c.total}
	u.InputTokensDetails.CachedTokens = c.cached
	o.Usage = u
	return o
}

// responseEvents writes a Responses API stream: response.created, a
// response.output_text.delta per token, response.completed with the usage.
// Every event has its type in an `event:` line too, and its
// sequence_number.
type responseEvents struct {
	s   *Server
	x   *exchange
	seq int
}

var _ events = (*responseEvents)(nil)

func (e *responseEvents) event(dst []byte, typ string, fields map[string]any) []byte {
	fields["type"], fields["sequence_number"] = typ, e.seq
	e.seq++
	data, _ := json.Marshal(fields) // our own values: cannot fail
	dst = append(dst, "event: "+typ+"\ndata: "...)
	dst = append(dst, data...)
	return append(dst, "\n\n"...)
}

func (e *responseEvents) start(dst []byte) []byte {
	return e.event(dst, "response.created", map[string]any{"response": e.s.response(e.x, nil, false)})
}

func (e *responseEvents) token(dst []byte, text string) []byte {
	return e.event(dst, "response.output_text.delta", map[string]any{"item_id": "msg_" + e.x.id[len("resp_"):],
		"output_index": 0, "content_index": 0, "delta": text})
}

func (e *responseEvents) end(dst []byte, c *call) []byte {
	return e.event(dst, "response.completed", map[string]any{"response": e.s.response(e.x, c, true)})
}
