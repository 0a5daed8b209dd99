package proxy

import (
	"net/http"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/anthropic"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/sse"
)

// Anthropic's Messages API (POST /v1/messages) is routed as chat is
// (internal/request renders it); what differs on its path is the shape of
// what kvroute itself answers: every error in Anthropic's form, and a cut
// stream ended with its error event, for the migration of a cut stream
// does not continue a Messages stream (docs/decisions/0017-messages-api.md).

// messagesPath reports whether path is the Messages API's: /v1/messages
// and what is under it (vLLM's /v1/messages/count_tokens).
func messagesPath(path string) bool {
	rest, ok := strings.CutPrefix(path, "/v1/messages")
	return ok && (rest == "" || rest[0] == '/')
}

// messagesWriter is the client's writer on the Messages API's path: the
// errors kvroute answers there take Anthropic's shape (writeError).
type messagesWriter struct{ http.ResponseWriter }

// FlushError flushes the client's writer, as sse.FlusherOf needs.
func (m *messagesWriter) FlushError() error { return sse.FlusherOf(m.ResponseWriter).FlushError() }

// SetReadDeadline is the client's, as readBody needs.
func (m *messagesWriter) SetReadDeadline(t time.Time) error {
	return setReadDeadline(m.ResponseWriter, t)
}

// Unwrap is for http.ResponseController.
func (m *messagesWriter) Unwrap() http.ResponseWriter { return m.ResponseWriter }

// messagesKey returns the API key of a Messages API client, which
// Anthropic's SDKs send in the x-api-key header rather than as a bearer
// token.
func messagesKey(h http.Header) (string, bool) {
	key := strings.TrimSpace(h.Get("X-Api-Key"))
	return key, key != ""
}

// speaksMessages reports whether w answers a Messages API request.
func speaksMessages(w http.ResponseWriter) bool {
	for {
		switch x := w.(type) {
		case *messagesWriter:
			return true
		case *heldWriter:
			w = x.ResponseWriter
		default:
			return false
		}
	}
}

// cutEvent is what ends a stream of kind ep cut short: OpenAI's error
// event and [DONE], or on the Messages API its error event.
func cutEvent(ep request.Endpoint, e *apiError) []byte {
	if ep == request.Messages {
		return anthropic.AppendEvent(make([]byte, 0, 256), e)
	}
	ev := e.AppendEvent(make([]byte, 0, 256))
	return append(ev, "data: [DONE]\n\n"...)
}
