package request

import (
	"strconv"

	"github.com/kvroute/kvroute/internal/jsonscan"
	"github.com/kvroute/kvroute/internal/router"
)

// WithOriginalResponseID returns a Responses API request's body with its
// previous_response_id, when kvroute minted it (router.MintResponseID),
// replaced by the id its backend gave the response, and that id; body
// itself and "" otherwise. The backend knows a response only by its own id.
func WithOriginalResponseID(body []byte, prev string) ([]byte, string) {
	orig, minted := router.OriginalResponseID(prev)
	if !minted {
		return body, ""
	}
	m, ok := jsonscan.Lookup(body, "previous_response_id")
	if !ok {
		return body, ""
	}
	// A minted id is plain ASCII, which JSON and Go quote alike.
	return splice(body, m.Val, m.End, strconv.Quote(orig)), orig
}
