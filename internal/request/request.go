// Package request reads the body of an OpenAI API request into the
// router's facts: model, session key, the prompt rendered canonically,
// max_tokens, and whether the response streams. The proxy and the endpoint
// picker (internal/epp) both read bodies with it, so that they route the
// same request alike.
package request

import (
	"strings"

	"github.com/kvroute/kvroute/internal/openai"
)

// Defaults of the fronts that read requests.
const (
	// DefaultSessionHeader is the request header that carries a session key.
	DefaultSessionHeader = "X-Session-ID"
	// DefaultMaxBodyBytes bounds a request body: 32 MiB, room for a long
	// context with images.
	DefaultMaxBodyBytes = 32 << 20
)

// Endpoint is the kind of API call being served.
type Endpoint uint8

// The endpoints. Generation endpoints are routed by the policy, by cache and
// load; embeddings by load only; others to any backend serving the model.
const (
	Chat Endpoint = iota
	Completion
	Embedding
	Other
	Responses // POST /v1/responses, routed as chat is
	Messages  // POST /v1/messages (Anthropic's Messages API), routed as chat is
)

// ParseGeneration reads the body of a request to path, which must be
// /v1/chat/completions, /v1/responses or /v1/messages (any other path is read as
// /v1/completions), as the proxy does. session is the session header's
// value (X-Session-ID by default), which takes precedence over the body's
// session keys (prompt_cache_key, previous_response_id, safety_identifier,
// user, metadata). The error is a 400 to answer the client with.
func ParseGeneration(path string, body []byte, session string) (*Generation, *openai.Error) {
	ep := Completion
	switch path {
	case "/v1/chat/completions":
		ep = Chat
	case "/v1/responses":
		ep = Responses
	case "/v1/messages":
		ep = Messages
	}
	return Parse(ep, body, session)
}

// StoredResponseID returns the response id of a path about a stored
// Responses API response (/v1/responses/{id}, /v1/responses/{id}/cancel,
// /v1/responses/{id}/input_items), or "". Only the backend that produced
// the response holds it (router.Router.ResponseBackend).
func StoredResponseID(path string) string {
	rest, ok := strings.CutPrefix(path, "/v1/responses/")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "/")
	return id
}
