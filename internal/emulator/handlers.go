package emulator

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/tokenizer"
)

var _ http.Handler = (*Server)(nil)

// ServeHTTP serves the OpenAI-compatible API, /health, /metrics and, if
// Config.Admin is set, /admin/faults.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/v1/messages") {
		w = messagesWriter{w} // messages.go: errors in Anthropic's shape
	}
	if s.apiKey && r.Method != http.MethodOptions && needsKey(r.URL.Path) && !s.authorized(r) {
		s.injected(faultUnauthorized)
		writeError(w, unauthorized())
		return
	}
	switch r.URL.Path {
	case "/v1/chat/completions":
		if allow(w, r, http.MethodPost) {
			s.handleChat(w, r)
		}
	case "/v1/completions":
		if allow(w, r, http.MethodPost) {
			s.handleCompletion(w, r)
		}
	case "/v1/responses":
		if allow(w, r, http.MethodPost) {
			s.handleResponses(w, r) // responses.go
		}
	case "/v1/messages":
		if allow(w, r, http.MethodPost) {
			s.handleMessages(w, r) // messages.go
		}
	case "/v1/messages/count_tokens":
		if allow(w, r, http.MethodPost) {
			s.handleCountTokens(w, r)
		}
	case "/tokenize":
		if allow(w, r, http.MethodPost) {
			s.handleTokenize(w, r)
		}
	case "/v1/models":
		if allow(w, r, http.MethodGet, http.MethodHead) {
			s.handleModels(w)
		}
	case "/health":
		if allow(w, r, http.MethodGet, http.MethodHead) {
			s.handleHealth(w)
		}
	case "/metrics":
		if allow(w, r, http.MethodGet, http.MethodHead) {
			s.metrics.handler.ServeHTTP(w, r)
		}
	case "/v1/load_lora_adapter", "/v1/unload_lora_adapter":
		switch {
		case s.lora == nil:
			s.notFound(w, r) // vLLM mounts them only with LoRA on
		case !allow(w, r, http.MethodPost):
		case r.URL.Path == "/v1/load_lora_adapter":
			s.handleLoadAdapter(w, r) // lora.go
		default:
			s.handleUnloadAdapter(w, r)
		}
	case "/admin/faults":
		if s.admin {
			s.handleAdminFaults(w, r)
			return
		}
		s.notFound(w, r)
	default:
		if id, ok := strings.CutPrefix(r.URL.Path, nixlPath); ok && id != "" {
			if allow(w, r, http.MethodGet) {
				s.handleNixl(w, r, id) // disagg.go
			}
			return
		}
		if id, ok := strings.CutPrefix(r.URL.Path, bootstrapPath); ok && id != "" {
			if allow(w, r, http.MethodGet) {
				s.handleBootstrap(w, r, id) // bootstrap.go
			}
			return
		}
		// A stored response, GET /v1/responses/{id} (responses.go).
		if id, ok := strings.CutPrefix(r.URL.Path, "/v1/responses/"); ok && id != "" && !strings.Contains(id, "/") {
			if allow(w, r, http.MethodGet, http.MethodHead) {
				s.handleStoredResponse(w, id)
			}
			return
		}
		s.notFound(w, r)
	}
}

func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	writeError(w, &openai.Error{
		Status:  http.StatusNotFound,
		Message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path),
		Type:    openai.TypeInvalidRequest,
		Code:    "not_found",
	})
}

// allow reports whether r's method is one of methods, answering 405 if not.
func allow(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m {
			return true
		}
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	writeError(w, &openai.Error{
		Status:  http.StatusMethodNotAllowed,
		Message: fmt.Sprintf("method %s is not allowed on %s; use %s", r.Method, r.URL.Path, strings.Join(methods, " or ")),
		Type:    openai.TypeInvalidRequest,
		Code:    "method_not_allowed",
	})
	return false
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	f := s.Faults()
	if s.beforeHeaders(w, r, &f) {
		return
	}
	var req chatRequest
	if e := decodeBody(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	x, e := s.prepare(req.Model, req.N, req.Stream, req.StreamOptions, true,
		namedLimit{"max_completion_tokens", req.MaxCompletionTokens},
		namedLimit{"max_tokens", req.MaxTokens})
	if e != nil {
		writeError(w, e)
		return
	}
	prompt, pos, e := chatPrompt(&req)
	if e != nil {
		writeError(w, e)
		return
	}
	x.faults = f
	if !s.withParams(w, r, x, req.KVTransferParams, req.bootstrap) { // disagg.go
		return
	}
	s.serve(w, r, x, prompt, pos, "messages")
}

func (s *Server) handleCompletion(w http.ResponseWriter, r *http.Request) {
	f := s.Faults()
	if s.beforeHeaders(w, r, &f) {
		return
	}
	var req completionRequest
	if e := decodeBody(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	x, e := s.prepare(req.Model, req.N, req.Stream, req.StreamOptions, false,
		namedLimit{"max_tokens", req.MaxTokens})
	if e != nil {
		writeError(w, e)
		return
	}
	prompt, e := completionPrompt(req.Prompt)
	if e != nil {
		writeError(w, e)
		return
	}
	x.faults = f
	if !s.withParams(w, r, x, req.KVTransferParams, req.bootstrap) { // disagg.go
		return
	}
	// A prompt that ends in a reply under way (a cut completion re-sent
	// with its text so far) continues that reply.
	s.serve(w, r, x, prompt, tokenizer.ReplyStart(s.seed, prompt), "prompt")
}

// exchange is what a handler knows about the response it is producing.
type exchange struct {
	chat         bool
	id           string
	created      int64
	stream       bool
	includeUsage bool
	maxTokens    *int   // nil: natural length
	events       events // a stream's events (sse.go, responses.go)
	faults       Faults // in force when the request arrived
	// responses marks a Responses API request (responses.go); done, when
	// not nil, is called with the call once the response completed.
	responses bool
	done      func(*call)
	// messages marks a Messages API request (messages.go); call is the
	// engine's call once serve made it.
	messages bool
	call     *call
	// model is the model the response names: the served one, or the LoRA
	// adapter the request named (adapter, else empty).
	model, adapter string
	// kv are the request's kv_transfer_params, nil for none; host is the
	// address its client reached this server at (disagg.go).
	kv   *kvParams
	host string
	boot *bootstrap // SGLang's (bootstrap.go)
}

// modelNotFound is vLLM's error for a model it does not serve.
func modelNotFound(model string) *openai.Error {
	return &openai.Error{
		Status:  http.StatusNotFound,
		Message: fmt.Sprintf("The model `%s` does not exist.", model),
		Type:    openai.TypeInvalidRequest,
		Param:   "model",
		Code:    "model_not_found",
	}
}

// prepare checks the fields shared by both endpoints.
func (s *Server) prepare(model string, n *int, stream bool, opts *streamOptions, chat bool, limits ...namedLimit) (*exchange, *openai.Error) {
	adapter := ""
	if model != "" && model != s.model {
		if s.adapter(model) == 0 {
			return nil, modelNotFound(model)
		}
		adapter = model
	}
	maxTokens, e := checkCommon(n, limits...)
	if e != nil {
		return nil, e
	}
	x := &exchange{
		chat:         chat,
		created:      s.clock.Now().Unix(),
		stream:       stream,
		includeUsage: stream && opts != nil && opts.IncludeUsage,
		maxTokens:    maxTokens,
		model:        cmp.Or(adapter, s.model),
		adapter:      adapter,
	}
	object := "text_completion"
	x.id = "cmpl-" + randomHex()
	if chat {
		object = "chat.completion.chunk"
		x.id = "chatcmpl-" + randomHex()
	}
	x.events = newChunker(x.id, object, x.created, x.model, chat, x.includeUsage)
	return x, nil
}

// serve runs prompt, whose last pos tokens are a reply under way, through
// the engine and writes the response.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, x *exchange, prompt []int32, pos int, what string) {
	c, e := s.newCall(prompt, pos, x.maxTokens, what)
	if e != nil {
		writeError(w, e)
		return
	}
	s.runUnder(c, x.adapter)
	if e := s.remoteKV(r.Context(), c, x); e != nil { // bootstrap.go
		writeError(w, e)
		return
	}
	if err := s.submit(c); err != nil {
		writeError(w, submitError(err))
		return
	}
	x.call = c
	var ok bool
	if x.stream {
		ok = s.stream(r.Context(), w, c, x)
	} else {
		ok = s.respond(r.Context(), w, c, x)
	}
	if ok && x.done != nil {
		x.done(c)
	}
	if ok {
		s.log.Debug("request done", "id", x.id, "prompt_tokens", c.req.PromptLen,
			"cached_tokens", c.cached, "completion_tokens", c.total, "finish_reason", c.finishReason(),
			"model_ttft", c.ttft, "model_latency", c.latency)
	}
}

// submitError maps an error of Server.submit to the client's error.
func submitError(err error) *openai.Error {
	switch {
	case errors.Is(err, errStopped):
		return unavailable()
	case errors.Is(err, engine.ErrTooLong):
		return &openai.Error{Status: http.StatusBadRequest, Message: err.Error(),
			Type: openai.TypeInvalidRequest, Code: "context_length_exceeded"}
	case errors.Is(err, engine.ErrInvalid):
		return badRequest("", "%v", err)
	}
	return &openai.Error{Status: http.StatusInternalServerError, Message: err.Error(), Type: openai.TypeServer}
}

func unavailable() *openai.Error {
	return &openai.Error{Status: http.StatusServiceUnavailable, Message: "the server is shutting down",
		Type: openai.TypeServer, Code: "service_unavailable"}
}

// respond waits for the whole output and writes a non-streaming response. It
// reports whether the request completed.
func (s *Server) respond(ctx context.Context, w http.ResponseWriter, c *call, x *exchange) bool {
	cut, hang := cutAfter(&x.faults, len(c.pieces))
	for have := 0; have < c.total; {
		n, err := s.await(ctx, c, have)
		if err != nil {
			s.abort(c)
			if errors.Is(err, errStopped) {
				writeError(w, unavailable())
			}
			return false
		}
		have = n
		if cut > 0 && have >= cut {
			s.abort(c)
			if !hang {
				s.die()
			}
			s.injected(faultHangAfterFirst)
			if s.hang(ctx) {
				writeError(w, unavailable())
			}
			return false
		}
	}
	text := strings.Join(c.pieces, "")
	h := w.Header()
	h.Set(HeaderModelTTFT, seconds(c.ttft))
	h.Set(HeaderModelLatency, seconds(c.latency))
	u := c.usage()
	reason := c.finishReason()
	kv := s.hold(c, x.kv, x.id, x.host) // disagg.go
	s.roomDone(c, x.boot)               // bootstrap.go
	switch {
	case x.responses:
		writeJSON(w, http.StatusOK, s.response(x, c, true)) // responses.go
	case x.messages:
		writeJSON(w, http.StatusOK, s.message(x, c, true)) // messages.go
	case x.chat:
		writeJSON(w, http.StatusOK, chatCompletion{
			ID: x.id, Object: "chat.completion", Created: x.created, Model: x.model,
			Choices: []chatChoice{{
				Message:      chatReply{Role: "assistant", Content: text, ToolCalls: []json.RawMessage{}},
				FinishReason: reason,
			}},
			Usage: u,

			KVTransferParams: kv,
		})
	default:
		writeJSON(w, http.StatusOK, textCompletion{
			ID: x.id, Object: "text_completion", Created: x.created, Model: x.model,
			Choices: []textChoice{{Text: text, FinishReason: reason}},
			Usage:   u,

			KVTransferParams: kv,
		})
	}
	return true
}

// stream writes the output as server-sent events while it is produced. Every
// batch of events is flushed as soon as it is written. It reports whether the
// request completed.
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, c *call, x *exchange) bool {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	h.Set("Trailer", HeaderModelTTFT+", "+HeaderModelLatency)
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		s.abort(c)
		return false
	}
	cut, hang := cutAfter(&x.faults, len(c.pieces))
	buf := make([]byte, 0, 1024)
	for have := 0; have < c.total; {
		n, err := s.await(ctx, c, have)
		if err != nil {
			s.abort(c)
			if errors.Is(err, errStopped) {
				_, _ = w.Write(errorEvent(w, buf[:0], unavailable()))
				_ = rc.Flush()
			}
			return false
		}
		buf = buf[:0]
		if have == 0 {
			buf = x.events.start(buf)
		}
		if cut > 0 {
			n = min(n, cut)
		}
		for i := have; i < n && i < len(c.pieces); i++ {
			buf = x.events.token(buf, c.pieces[i])
		}
		have = n
		if have == cut {
			return s.cutStream(ctx, w, rc, c, buf, hang)
		}
		if have == c.total {
			buf = x.events.end(buf, c)
		}
		if _, err := w.Write(buf); err != nil {
			s.abort(c)
			return false
		}
		if err := rc.Flush(); err != nil {
			s.abort(c)
			return false
		}
	}
	h.Set(HeaderModelTTFT, seconds(c.ttft))
	h.Set(HeaderModelLatency, seconds(c.latency))
	return true
}

// cutStream writes and flushes buf, the stream's last content, takes c out
// of the engine, and then stalls until the request ends (hang) or closes the
// connection without the terminating chunk. It reports false: the request
// did not complete.
func (s *Server) cutStream(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController, c *call, buf []byte, hang bool) bool {
	_, err := w.Write(buf)
	if err == nil {
		err = rc.Flush()
	}
	s.abort(c)
	if err != nil {
		return false
	}
	if !hang {
		s.die()
	}
	s.injected(faultHangAfterFirst)
	if s.hang(ctx) {
		_, _ = w.Write(errorEvent(w, buf[:0], unavailable()))
		_ = rc.Flush()
	}
	return false
}

// handleHealth answers 200 with an empty body, as vLLM does, until the
// driver stops; 503 with the health_fail fault.
func (s *Server) handleHealth(w http.ResponseWriter) {
	select {
	case <-s.stopped:
		writeError(w, unavailable())
	default:
		if s.faults.Load().HealthFail {
			s.injected(faultHealth)
			writeError(w, &openai.Error{Status: http.StatusServiceUnavailable,
				Message: "the server is unhealthy (injected fault)", Type: openai.TypeServer,
				Code: "service_unavailable"})
			return
		}
		w.WriteHeader(http.StatusOK)
	}
}

func (s *Server) handleModels(w http.ResponseWriter) {
	writeJSON(w, http.StatusOK, modelList{
		Object: "list",
		Data: append([]modelCard{{
			ID: s.model, Object: "model", Created: s.created, OwnedBy: "vllm",
			Root: s.model, MaxModelLen: s.profile.MaxModelLen,
		}}, s.adapterCards()...),
	})
}

// usage is a response's token accounting. Call it once the output is done.
func (c *call) usage() usage {
	return usage{
		PromptTokens:        c.req.PromptLen,
		CompletionTokens:    c.total,
		TotalTokens:         c.req.PromptLen + c.total,
		PromptTokensDetails: promptTokensDetails{CachedTokens: c.cached},
	}
}

// seconds formats d as decimal seconds.
func seconds(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 6, 64) }

// randomHex returns 32 random hex digits, the shape of vLLM's request ids.
func randomHex() string { return fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64()) }

// Response bodies, shaped as OpenAI and vLLM send them.
type (
	usage struct {
		PromptTokens        int                 `json:"prompt_tokens"`
		CompletionTokens    int                 `json:"completion_tokens"`
		TotalTokens         int                 `json:"total_tokens"`
		PromptTokensDetails promptTokensDetails `json:"prompt_tokens_details"`
	}
	promptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	}
	chatCompletion struct {
		ID      string       `json:"id"`
		Object  string       `json:"object"`
		Created int64        `json:"created"`
		Model   string       `json:"model"`
		Choices []chatChoice `json:"choices"`
		Usage   usage        `json:"usage"`
		// KVTransferParams are a prefill's (disagg.go).
		KVTransferParams *kvParams `json:"kv_transfer_params,omitempty"`
	}
	chatChoice struct {
		Index        int       `json:"index"`
		Message      chatReply `json:"message"`
		Logprobs     *struct{} `json:"logprobs"`
		FinishReason string    `json:"finish_reason"`
		StopReason   *string   `json:"stop_reason"`
	}
	chatReply struct {
		Role      string            `json:"role"`
		Content   string            `json:"content"`
		ToolCalls []json.RawMessage `json:"tool_calls"`
	}
	textCompletion struct {
		ID      string       `json:"id"`
		Object  string       `json:"object"`
		Created int64        `json:"created"`
		Model   string       `json:"model"`
		Choices []textChoice `json:"choices"`
		Usage   usage        `json:"usage"`
		// KVTransferParams are a prefill's (disagg.go).
		KVTransferParams *kvParams `json:"kv_transfer_params,omitempty"`
	}
	textChoice struct {
		Index        int       `json:"index"`
		Text         string    `json:"text"`
		Logprobs     *struct{} `json:"logprobs"`
		FinishReason string    `json:"finish_reason"`
		StopReason   *string   `json:"stop_reason"`
	}
	modelList struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}
	modelCard struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen int     `json:"max_model_len"`
	}
)
