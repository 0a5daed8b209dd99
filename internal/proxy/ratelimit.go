package proxy

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// rateLimited is OpenAI's 429 for a key over its limit of kind
// ("requests" or "tokens"), with Retry-After in whole seconds when waiting
// helps.
func rateLimited(w http.ResponseWriter, name, kind string, limit, asked int, wait time.Duration) *apiError {
	unit := map[string]string{typeRequests: "requests per min (RPM)", typeTokens: "tokens per min (TPM)"}[kind]
	msg := fmt.Sprintf("Rate limit reached for key %s on %s: Limit %d, Requested %d.", name, unit, limit, asked)
	if wait < 0 {
		msg = fmt.Sprintf("Request too large for key %s on %s: Limit %d, Requested %d.", name, unit, limit, asked)
	} else {
		secs := max(1, int(math.Ceil(wait.Seconds())))
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		msg += fmt.Sprintf(" Please try again in %ds.", secs)
	}
	return &apiError{Status: http.StatusTooManyRequests, Message: msg, Type: kind, Code: codeRateLimited}
}

// Error codes of authentication and rate limiting, as OpenAI's API sends
// them. A 429's type says which limit was hit: "requests" or "tokens".
const (
	codeInvalidAPIKey = "invalid_api_key"
	codeRateLimited   = "rate_limit_exceeded"
	typeRequests      = "requests"
	typeTokens        = "tokens"
)

// unauthorized is OpenAI's 401: the message never repeats the key given.
func unauthorized(missing bool) *apiError {
	msg := "Incorrect API key provided."
	if missing {
		msg = "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
	}
	return &apiError{Status: http.StatusUnauthorized, Message: msg, Type: typeInvalidRequest, Code: codeInvalidAPIKey}
}
