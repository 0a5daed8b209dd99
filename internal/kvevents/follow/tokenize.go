package follow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/kvevents"
)

// Defaults for the tokenizer, flags of kvroute serve.
const (
	// DefaultTokenizeTimeout bounds a /tokenize call on the request's
	// path: a chat prompt of a few thousand tokens tokenizes in a
	// millisecond or two; past the bound the index decides.
	DefaultTokenizeTimeout = 50 * time.Millisecond
	// DefaultTokenizeCache is how many prompts' token ids are kept: a
	// retried or hedged request, and every router replica's copy of one
	// through a shared backend, ask once.
	DefaultTokenizeCache = 4096
)

// maxTokenizeBytes bounds a /tokenize answer: a 1M-token prompt's ids.
const maxTokenizeBytes = 16 << 20

// Tokenizer asks a backend's POST /tokenize (vLLM's, the emulator's) for a
// request's prompt token ids, with the chat template applied by the
// backend itself: the ids its KV events' blocks carry. The router cannot
// apply a model's chat template (a Jinja program in its tokenizer config)
// nor run its tokenizer exactly; the backend does both. Answers are cached
// by the prompt's bytes. It is safe for concurrent use.
type Tokenizer struct {
	client  *http.Client
	timeout time.Duration

	mu    sync.Mutex
	cache map[uint64]*cached
	order []uint64 // insertion order, for eviction
	limit int
}

type cached struct {
	tokens []int32
}

// NewTokenizer returns a tokenizer using client (nil: http.DefaultClient)
// with a timeout per call and a cache of size prompts (0: the defaults).
func NewTokenizer(client *http.Client, timeout time.Duration, size int) *Tokenizer {
	if client == nil {
		client = http.DefaultClient
	}
	if timeout <= 0 {
		timeout = DefaultTokenizeTimeout
	}
	if size <= 0 {
		size = DefaultTokenizeCache
	}
	return &Tokenizer{client: client, timeout: timeout, cache: make(map[uint64]*cached), limit: size}
}

// ErrNoPrompt means a request body has neither messages nor a prompt the
// tokenizer can send (a Responses API request, say).
var ErrNoPrompt = errors.New("follow: no messages or prompt to tokenize")

// Tokens returns the token ids of the prompt of body (a chat or completion
// request's JSON) as backend b tokenizes it.
func (t *Tokenizer) Tokens(ctx context.Context, b *fleet.Backend, body []byte) ([]int32, error) {
	req, key, err := tokenizeBody(body)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	c := t.cache[key]
	t.mu.Unlock()
	if c != nil {
		return c.tokens, nil
	}
	toks, err := t.ask(ctx, b, req)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.cache[key]; !ok {
		if len(t.order) >= t.limit {
			delete(t.cache, t.order[0])
			t.order = t.order[1:]
		}
		t.cache[key] = &cached{tokens: toks}
		t.order = append(t.order, key)
	}
	return toks, nil
}

// tokenizeBody returns the /tokenize request for a generation request's
// body, and the key it is cached under: the fields that decide the
// tokens.
func tokenizeBody(body []byte) ([]byte, uint64, error) {
	var in struct {
		Model              string          `json:"model"`
		Messages           json.RawMessage `json:"messages"`
		Prompt             json.RawMessage `json:"prompt"`
		Tools              json.RawMessage `json:"tools,omitempty"`
		ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs,omitempty"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, 0, fmt.Errorf("kvevents: tokenize: %w", err)
	}
	var out any
	switch {
	case len(in.Messages) > 0:
		out = struct {
			Model               string          `json:"model,omitempty"`
			Messages            json.RawMessage `json:"messages"`
			Tools               json.RawMessage `json:"tools,omitempty"`
			ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs,omitempty"`
			AddGenerationPrompt bool            `json:"add_generation_prompt"`
		}{in.Model, in.Messages, in.Tools, in.ChatTemplateKwargs, true}
	case len(in.Prompt) > 0 && in.Prompt[0] == '"':
		out = struct {
			Model  string          `json:"model,omitempty"`
			Prompt json.RawMessage `json:"prompt"`
		}{in.Model, in.Prompt}
	default:
		return nil, 0, ErrNoPrompt
	}
	req, err := json.Marshal(out)
	if err != nil {
		return nil, 0, err
	}
	return req, xxhash.Sum64(req), nil
}

func (t *Tokenizer) ask(ctx context.Context, b *fleet.Backend, body []byte) ([]int32, error) {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	u := b.URL.JoinPath("/tokenize")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if b.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+string(b.APIKey))
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("kvevents: tokenize at %s: %w", b.Name, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenizeBytes))
	if err != nil {
		return nil, fmt.Errorf("kvevents: tokenize at %s: %w", b.Name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("kvevents: tokenize at %s: status %d", b.Name, resp.StatusCode)
	}
	var out struct {
		Tokens []int64 `json:"tokens"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("kvevents: tokenize at %s: %w", b.Name, err)
	}
	return kvevents.TokenIDs(out.Tokens), nil
}
