package proxy

import (
	"fmt"
	"net/http"
	"strings"
)

// pathRule allows a path, or with subtree every path under it, for methods
// (all if empty).
type pathRule struct {
	path    string
	subtree bool
	methods []string
}

// defaultRules are the API paths the proxy forwards without --allow-path:
// the OpenAI inference endpoints (POST /v1/responses to create a response
// included), Anthropic's Messages API and its token count, the model list
// and one model's entry, and vLLM's /v1/rerank and /v1/score (inference,
// as embeddings are). Everything else a backend
// serves — vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter,
// /sleep, /wake_up, /v1/files, the stored responses under /v1/responses/
// (retrieve, cancel, input items), the tokenizers at the root — changes the
// backend, reads what other clients stored, or is for operators, and gets
// 404 unless an operator allows it.
var defaultRules = []pathRule{
	{path: "/v1/chat/completions"},
	{path: "/v1/completions"},
	{path: "/v1/responses", methods: []string{http.MethodPost}},
	{path: "/v1/messages", methods: []string{http.MethodPost}},
	{path: "/v1/messages/count_tokens", methods: []string{http.MethodPost}},
	{path: "/v1/embeddings"},
	{path: "/v1/models"},
	{path: "/v1/models/", subtree: true, methods: []string{http.MethodGet, http.MethodHead}},
	{path: "/v1/rerank", methods: []string{http.MethodPost}},
	{path: "/v1/score", methods: []string{http.MethodPost}},
}

// parseAllowPath makes the rule of an --allow-path PREFIX: the path itself
// and every path under it, for every method. PREFIX must be a clean
// absolute path.
func parseAllowPath(prefix string) (pathRule, error) {
	if !strings.HasPrefix(prefix, "/") || prefix == "/" {
		return pathRule{}, fmt.Errorf("allowed path %q must start with / and name something under it", prefix)
	}
	if e := checkRawPath(prefix); e != nil {
		return pathRule{}, fmt.Errorf("allowed path %q: %s", prefix, e.Message)
	}
	return pathRule{path: strings.TrimSuffix(prefix, "/"), subtree: true}, nil
}

// match reports whether the rule covers path, and if so the methods it
// allows there.
func (r pathRule) match(path string) (bool, []string) {
	switch {
	case path == r.path:
	case r.subtree && strings.HasPrefix(path, r.path) &&
		(strings.HasSuffix(r.path, "/") || path[len(r.path)] == '/'):
	default:
		return false, nil
	}
	return true, r.methods
}

// checkPath rejects request paths that mean different things to different
// parsers, so that what the allow-list approves is what the backend serves:
// dot segments (also percent-encoded), encoded slashes and backslashes,
// backslashes, empty segments, encoded percent signs (double encoding) and
// control characters. It reads the path as the client sent it
// (RequestURI), not only the decoded URL.Path.
func checkPath(r *http.Request) *apiError {
	raw := r.RequestURI
	if !strings.HasPrefix(raw, "/") { // absolute form, "*", or a request not from a server
		raw = r.URL.EscapedPath()
	}
	raw, _, _ = strings.Cut(raw, "?")
	if e := checkRawPath(raw); e != nil {
		return e
	}
	// The decoded path too: it is what goes upstream.
	return checkRawPath(r.URL.Path)
}

func checkRawPath(raw string) *apiError {
	lower := strings.ToLower(raw)
	bad := func(why string) *apiError {
		return &apiError{
			Status:  http.StatusBadRequest,
			Message: "Invalid URL path: " + why,
			Type:    typeInvalidRequest,
			Code:    "invalid_path",
		}
	}
	switch {
	case strings.ContainsRune(raw, '\\') || strings.Contains(lower, "%5c"):
		return bad("backslashes are not allowed")
	case strings.Contains(lower, "%2f"):
		return bad("encoded slashes are not allowed")
	case strings.Contains(lower, "%25"):
		return bad("encoded percent signs are not allowed")
	case strings.Contains(raw, "//"):
		return bad("empty path segments are not allowed")
	}
	for i := 0; i < len(raw); i++ {
		if c := raw[i]; c < 0x20 || c == 0x7f {
			return bad("control characters are not allowed")
		}
		if raw[i] == '%' && i+2 < len(raw) && (raw[i+1] < '2' || lower[i+1:i+3] == "7f") {
			return bad("control characters are not allowed")
		}
	}
	dots := strings.ReplaceAll(lower, "%2e", ".")
	for seg := range strings.SplitSeq(dots, "/") {
		if seg == "." || seg == ".." {
			return bad("dot segments are not allowed")
		}
	}
	return nil
}
