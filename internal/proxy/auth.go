package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"unicode"

	yaml "go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/internal/fleet"
)

// Error codes of authentication and rate limiting, as OpenAI's API sends
// them. A 429's type says which limit was hit: "requests" or "tokens".
const (
	codeInvalidAPIKey = "invalid_api_key"
	codeRateLimited   = "rate_limit_exceeded"
	typeRequests      = "requests"
	typeTokens        = "tokens"
)

// APIKey is a client API key and what its holder may do.
type APIKey struct {
	// Key is the bearer token the client sends ("Authorization: Bearer
	// KEY"). It is never logged or shown in metrics: Name is.
	Key fleet.Secret
	// Name identifies the key in logs and in the metrics' "key" label.
	Name string
	// Priority is the key's priority class, higher first. It is carried
	// with the request (KeyFromContext) for admission control; the proxy
	// does not act on it yet.
	Priority int
	// RPM is the most requests a minute the key may send; 0 is no limit.
	RPM int
	// TPM is the most tokens a minute the key may spend, counted at
	// admission as the prompt's estimated tokens plus max_tokens; 0 is no
	// limit.
	TPM int
}

// keyFile is the YAML of an API keys file.
type keyFile []struct {
	Key      string `yaml:"key"`
	KeyEnv   string `yaml:"key_env"`
	Name     string `yaml:"name"`
	Priority int    `yaml:"priority"`
	RPM      int    `yaml:"rpm"`
	TPM      int    `yaml:"tpm"`
}

// LoadAPIKeys reads a YAML file of client API keys:
//
//   - name: team-a            # required, unique: shown in logs and metrics
//     key_env: TEAM_A_KEY     # or key: sk-...; the env var must be set
//     priority: 1             # optional
//     rpm: 600                # optional requests per minute, 0: no limit
//     tpm: 200000             # optional tokens per minute, 0: no limit
//
// Unknown fields, missing or duplicate names and keys, and negative limits
// are errors.
func LoadAPIKeys(path string) ([]APIKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read API keys: %w", err)
	}
	keys, err := parseAPIKeys(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return keys, nil
}

func parseAPIKeys(data []byte) ([]APIKey, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var kf keyFile
	if err := dec.Decode(&kf); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	keys := make([]APIKey, 0, len(kf))
	for i, e := range kf {
		k := APIKey{Key: fleet.Secret(e.Key), Name: e.Name, Priority: e.Priority, RPM: e.RPM, TPM: e.TPM}
		switch {
		case e.Key != "" && e.KeyEnv != "":
			return nil, fmt.Errorf("key %d: give key or key_env, not both", i+1)
		case e.KeyEnv != "":
			s, err := fleet.SecretFromEnv(e.KeyEnv)
			if err != nil {
				return nil, fmt.Errorf("key %d: %w", i+1, err)
			}
			k.Key = s
		}
		keys = append(keys, k)
	}
	if err := CheckAPIKeys(keys); err != nil {
		return nil, err
	}
	return keys, nil
}

// CheckAPIKeys validates keys: each has a key and a name fit for a log line,
// names and keys are unique, limits are not negative.
func CheckAPIKeys(keys []APIKey) error {
	names := make(map[string]bool, len(keys))
	secrets := make(map[fleet.Secret]bool, len(keys))
	for i, k := range keys {
		switch {
		case k.Key == "":
			return fmt.Errorf("key %d (%s): empty key", i+1, k.Name)
		case strings.ContainsFunc(string(k.Key), unicode.IsSpace):
			return fmt.Errorf("key %d (%s): the key has white space", i+1, k.Name)
		case k.Name == "":
			return fmt.Errorf("key %d: no name", i+1)
		case strings.ContainsFunc(k.Name, func(r rune) bool { return !unicode.IsPrint(r) || r > unicode.MaxASCII }):
			return fmt.Errorf("key %d: name %q must be printable ASCII", i+1, k.Name)
		case names[k.Name]:
			return fmt.Errorf("key %d: name %q used twice", i+1, k.Name)
		case secrets[k.Key]:
			return fmt.Errorf("key %d (%s): the same key is given twice", i+1, k.Name)
		case k.RPM < 0 || k.TPM < 0:
			return fmt.Errorf("key %d (%s): rpm and tpm must not be negative", i+1, k.Name)
		}
		names[k.Name], secrets[k.Key] = true, true
	}
	return nil
}

// client is a configured key at run time: its hash and its limits.
type client struct {
	APIKey
	hash     [sha256.Size]byte
	requests *bucket // nil: no limit
	tokens   *bucket // nil: no limit
}

// keyRing finds the client of a bearer token.
type keyRing []*client

func newKeyRing(keys []APIKey) keyRing {
	ring := make(keyRing, 0, len(keys))
	for _, k := range keys {
		c := &client{APIKey: k, hash: sha256.Sum256([]byte(k.Key))}
		if k.RPM > 0 {
			c.requests = newBucket(k.RPM)
		}
		if k.TPM > 0 {
			c.tokens = newBucket(k.TPM)
		}
		ring = append(ring, c)
	}
	return ring
}

// find returns the client whose key is token, or nil. It compares SHA-256
// hashes in constant time, and all of them, so that neither the token's
// length nor how much of it matched nor which key it is shows in the time
// the answer takes.
func (ring keyRing) find(token string) *client {
	h := sha256.Sum256([]byte(token))
	var found *client
	for _, c := range ring {
		if subtle.ConstantTimeCompare(h[:], c.hash[:]) == 1 {
			found = c
		}
	}
	return found
}

// bearer returns the token of an "Authorization: Bearer TOKEN" header.
func bearer(h http.Header) (string, bool) {
	v := h.Get("Authorization")
	scheme, token, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

type keyContext struct{}

// KeyFromContext returns the API key that authenticated the request whose
// context is ctx (its Name, Priority and limits), if keys are configured.
func KeyFromContext(ctx context.Context) (APIKey, bool) {
	c, ok := ctx.Value(keyContext{}).(*client)
	if !ok {
		return APIKey{}, false
	}
	return c.APIKey, true
}

func clientFrom(ctx context.Context) *client {
	c, _ := ctx.Value(keyContext{}).(*client)
	return c
}

// unauthorized is OpenAI's 401: the message never repeats the key given.
func unauthorized(missing bool) *apiError {
	msg := "Incorrect API key provided."
	if missing {
		msg = "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
	}
	return &apiError{Status: http.StatusUnauthorized, Message: msg, Type: typeInvalidRequest, Code: codeInvalidAPIKey}
}
