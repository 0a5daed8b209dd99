package emulator

import (
	"encoding/json"
	"net/http"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/tokenizer"
)

// tokenizeRequest is vLLM's POST /tokenize body: a completion's prompt, or
// a chat's messages rendered with the chat template.
type tokenizeRequest struct {
	Model    string          `json:"model"`
	Prompt   json.RawMessage `json:"prompt"`
	Messages []chatMessage   `json:"messages"`
	// AddGenerationPrompt (chat; default true) ends the prompt with the
	// assistant header a reply continues, as a chat completion's does.
	AddGenerationPrompt *bool `json:"add_generation_prompt"`
	// AddSpecialTokens (completion; default true) starts it with BOS.
	AddSpecialTokens *bool `json:"add_special_tokens"`
}

// tokenizeResponse is vLLM's answer.
type tokenizeResponse struct {
	Count       int     `json:"count"`
	MaxModelLen int     `json:"max_model_len"`
	Tokens      []int32 `json:"tokens"`
	TokenStrs   any     `json:"token_strs"`
}

// handleTokenize serves POST /tokenize: the token ids a chat or completion
// request's prompt has in this server's engine, what a router needs to
// match a prompt against the blocks the KV events announce.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if e := decodeBody(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	if req.Model != "" && req.Model != s.model {
		writeError(w, modelNotFound(req.Model))
		return
	}
	toks, e := tokenizePrompt(&req)
	if e != nil {
		writeError(w, e)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(tokenizeResponse{Count: len(toks), MaxModelLen: s.profile.MaxModelLen, Tokens: toks})
}

func tokenizePrompt(req *tokenizeRequest) ([]int32, *openai.Error) {
	if req.Messages != nil {
		msgs, e := chatMessages(req.Messages)
		if e != nil {
			return nil, e
		}
		return tokenizer.EncodeChat(nil, msgs, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt), nil
	}
	toks, e := completionPrompt(req.Prompt)
	if e == nil && req.AddSpecialTokens != nil && !*req.AddSpecialTokens && len(toks) > 0 && toks[0] == tokenizer.BOS {
		toks = toks[1:]
	}
	return toks, e
}
