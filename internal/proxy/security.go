package proxy

import (
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/auth"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/router"
)

// Security configures who may use the proxy and what reaches the backends.
// The zero value is the proxy as it was: open to anyone, the default
// allow-list of paths, client credentials not forwarded, /metrics on the
// API.
type Security struct {
	// APIKeys are the client keys. Empty means no authentication (logged
	// as a warning once, at New).
	APIKeys []auth.APIKey
	// ForwardClientAuth sends the client's Authorization, Cookie and
	// Proxy-Authorization headers to the backends. Off, they are removed:
	// they are the client's credentials for the proxy, not the backends'.
	// A backend's own API key (fleet.Backend.APIKey) is sent either way.
	ForwardClientAuth bool
	// AllowPaths are path prefixes forwarded besides the default ones
	// (see defaultRules), with every method and everything under them.
	AllowPaths []string
	// MetricsElsewhere stops the API from serving /metrics: the caller
	// serves MetricsHandler on a listener of its own.
	MetricsElsewhere bool
}

// security is Security at run time.
type security struct {
	keys             auth.Ring
	rules            []pathRule
	forwardAuth      bool
	metricsElsewhere bool

	keyRequests *prometheus.CounterVec // key, outcome
	keyTokens   *prometheus.CounterVec // key
	authFailed  *prometheus.CounterVec // reason
}

// Outcomes of the kvroute_key_requests_total metric.
const (
	outcomeAdmitted       = "admitted"
	outcomeRequestLimited = "rate_limited_requests"
	outcomeTokenLimited   = "rate_limited_tokens"
)

func newSecurity(s Security, reg prometheus.Registerer, log *slog.Logger) (*security, error) {
	if err := auth.CheckAPIKeys(s.APIKeys); err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	sec := &security{
		keys:             auth.NewRing(s.APIKeys),
		rules:            defaultRules,
		forwardAuth:      s.ForwardClientAuth,
		metricsElsewhere: s.MetricsElsewhere,
		keyRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_key_requests_total",
			Help: "Authenticated requests by API key name and outcome: admitted past the key and request-rate checks, rate_limited_requests, or rate_limited_tokens (refused later, at the tokens check, so also counted as admitted).",
		}, []string{"key", "outcome"}),
		keyTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_key_tokens_total",
			Help: "Tokens charged to each API key at admission: estimated prompt tokens plus max_tokens.",
		}, []string{"key"}),
		authFailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_auth_failures_total",
			Help: `Requests refused with 401, by reason ("missing" or "invalid" key).`,
		}, []string{"reason"}),
	}
	for _, p := range s.AllowPaths {
		r, err := parseAllowPath(p)
		if err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
		sec.rules = append(sec.rules, r)
	}
	for _, c := range []prometheus.Collector{sec.keyRequests, sec.keyTokens, sec.authFailed} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("proxy: register metrics: %w", err)
		}
	}
	if len(sec.keys) == 0 {
		log.Warn("no API keys configured: anyone who can reach the listener can use the backends")
	}
	return sec, nil
}

// admit decides whether the proxy serves r at all, before it routes it: the
// path is well formed, the client has a valid key (except for /healthz and
// /readyz, which probes call without one), the path is allowed, and the key
// is within its request rate. It returns r with the key in its context and
// true to go on; false when it has answered (an error, or an allowed path
// outside /v1 that it forwarded itself).
func (p *Proxy) admit(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	s := p.sec
	if e := checkPath(r); e != nil {
		p.reject(w, e)
		return r, false
	}
	path := r.URL.Path
	switch {
	case path == "/healthz" || path == "/health" || path == "/readyz":
		return r, true
	case path == "/metrics" && s.metricsElsewhere:
		p.reject(w, notFound(r))
		return r, false
	}
	var c *auth.Client
	if len(s.keys) > 0 {
		token, ok := auth.Bearer(r.Header)
		if !ok && messagesPath(path) {
			token, ok = messagesKey(r.Header) // messages.go: Anthropic's x-api-key
		}
		if ok {
			c = s.keys.Find(token)
		}
		if c == nil {
			reason := map[bool]string{true: "invalid", false: "missing"}[ok]
			s.authFailed.WithLabelValues(reason).Inc()
			p.log.Debug("request refused: API key "+reason, "path", path, "remote", r.RemoteAddr)
			e := unauthorized(!ok)
			if !ok && messagesPath(path) {
				e.Message = "You didn't provide an API key: send it in the x-api-key header, or as Authorization: Bearer KEY."
			}
			p.reject(w, e)
			return r, false
		}
		r = r.WithContext(auth.NewContext(r.Context(), c))
	}
	forwardHere := false
	if path != "/metrics" && (strings.HasPrefix(path, "/v1/") || path == "/v1") {
		ok, methods := s.allowed(path)
		if !ok {
			p.reject(w, notFound(r))
			return r, false
		}
		if len(methods) > 0 && !p.allow(w, r, methods...) {
			return r, false
		}
	} else if path != "/metrics" {
		// Outside /v1 the proxy serves nothing but probes and metrics; an
		// operator's --allow-path may forward more (vLLM's /tokenize).
		ok, _ := s.allowed(path)
		if !ok {
			p.reject(w, notFound(r))
			return r, false
		}
		forwardHere = true
	}
	if c != nil && c.Requests != nil {
		if ok, wait := c.Requests.Take(p.now(), 1); !ok {
			s.keyRequests.WithLabelValues(c.Name, outcomeRequestLimited).Inc()
			p.log.Info("request refused: requests per minute", "key", c.Name, "rpm", c.RPM)
			p.reject(w, rateLimited(w, c.Name, typeRequests, c.RPM, 1, wait))
			return r, false
		}
	}
	if c != nil {
		s.keyRequests.WithLabelValues(c.Name, outcomeAdmitted).Inc()
	}
	if forwardHere {
		p.serveByLoad(w, r, request.Other)
		return r, false
	}
	return r, true
}

// allowed reports whether a rule allows path, and the methods it allows
// there (all if empty). The first matching rule decides.
func (s *security) allowed(path string) (bool, []string) {
	for _, rule := range s.rules {
		if ok, methods := rule.match(path); ok {
			return true, methods
		}
	}
	return false, nil
}

// chargeTokens takes a generation's tokens from its key's tokens-per-minute
// allowance at admission: the prompt's estimated length (the router's
// estimate, set before this is called) plus max_tokens. The
// estimate is charged, not the usage the backend reports later, so that a
// limit holds before the work is done.
func (p *Proxy) chargeTokens(w http.ResponseWriter, r *http.Request, req *router.Request) *apiError {
	c := auth.ClientFrom(r.Context())
	if c == nil {
		return nil
	}
	n := estimateTokens(req)
	if c.Tokens != nil {
		if ok, wait := c.Tokens.Take(p.now(), n); !ok {
			p.sec.keyRequests.WithLabelValues(c.Name, outcomeTokenLimited).Inc()
			p.log.Info("request refused: tokens per minute", "key", c.Name, "tpm", c.TPM, "tokens", n)
			return rateLimited(w, c.Name, typeTokens, c.TPM, n, wait)
		}
	}
	p.sec.keyTokens.WithLabelValues(c.Name).Add(float64(n))
	return nil
}

// estimateTokens is a generation's tokens as the rate limit counts them.
func estimateTokens(req *router.Request) int {
	prompt := req.PromptTokens
	if prompt <= 0 {
		prompt = (len(req.Prompt) + router.TokenBytes - 1) / router.TokenBytes
	}
	return prompt + max(req.MaxTokens, 0)
}

// withCredentials edits the request to backend b: the client's credentials are
// removed unless forwarding them is configured, and the backend's own key
// is set. Called where the upstream request is built.
func (p *Proxy) withCredentials(out *http.Request, b *fleet.Backend) *http.Request {
	if !p.sec.forwardAuth {
		out.Header.Del("Authorization")
		out.Header.Del("Cookie")
		out.Header.Del("Proxy-Authorization")
		out.Header.Del("X-Api-Key") // Anthropic's clients send their key there
	}
	b.Authorize(out.Header)
	return out
}

// MetricsHandler serves the proxy's metrics at /metrics and a liveness
// answer at /healthz, for a listener of their own (Security.MetricsElsewhere)
// that operators can keep off the network clients use. Every other path is
// 404. With a Config.Registerer of the caller's, /metrics is 404 too: the
// caller serves its registry.
func (p *Proxy) MetricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/healthz" || r.URL.Path == "/health":
			if p.allow(w, r, http.MethodGet, http.MethodHead) {
				writeText(w, http.StatusOK, "ok\n")
			}
		case r.URL.Path == "/metrics" && p.metricsPage != nil:
			if p.allow(w, r, http.MethodGet, http.MethodHead) {
				p.metricsPage.ServeHTTP(w, r)
			}
		default:
			writeError(w, notFound(r))
		}
	})
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
