package proxy

import (
	"strings"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/router"
)

// Generation is what a router front reads from the body of a chat,
// completion or Responses API request: the routing facts, and whether the response streams
// and already carries its usage. The endpoint picker (internal/epp) reads
// bodies with it, so that it and the proxy route the same request alike.
type Generation struct {
	// Request is the router's facts: model, session key, the canonical
	// prompt, max_tokens.
	Request router.Request
	// Stream is the request's "stream": true.
	Stream bool
	// IncludeUsage is the request's stream_options.include_usage: true.
	IncludeUsage bool
}

// ParseGeneration reads the body of a request to path, which must be
// /v1/chat/completions or /v1/responses (any other path is read as
// /v1/completions), as the proxy does. session is the session header's
// value (X-Session-ID by default), which takes precedence over the body's
// session keys (prompt_cache_key, previous_response_id, safety_identifier,
// user, metadata). The error is a 400 to answer the client with.
func ParseGeneration(path string, body []byte, session string) (*Generation, *openai.Error) {
	ep := endpointCompletion
	switch path {
	case "/v1/chat/completions":
		ep = endpointChat
	case "/v1/responses":
		ep = endpointResponses
	}
	g, e := parseGeneration(ep, body, session)
	if e != nil {
		return nil, e
	}
	return &Generation{Request: g.req, Stream: g.stream, IncludeUsage: g.includeUsage}, nil
}

// WithIncludeUsage returns body, a valid JSON object, with
// stream_options.include_usage set to true, as the proxy sends streamed
// requests so that the backend reports the cached tokens the router learns
// from. It reports false, and returns body as it is, when stream_options is
// neither absent, null nor an object.
func WithIncludeUsage(body []byte) ([]byte, bool) { return withIncludeUsage(body) }

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
