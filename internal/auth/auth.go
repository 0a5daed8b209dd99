// Package auth holds the clients' API keys of kvroute serve: their YAML
// file, their validation, the lookup of a bearer token in constant time,
// the key a request carries in its context, and each key's per-minute
// allowances (Bucket). The proxy decides what a request may do with them.
package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"

	yaml "go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/internal/fleet"
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

// Client is a configured key at run time: its hash and its limits.
type Client struct {
	APIKey
	hash [sha256.Size]byte
	// Requests and Tokens are the key's allowances a minute; nil: no limit.
	Requests, Tokens *Bucket
}

// Ring finds the client of a bearer token. It is safe for concurrent use.
type Ring []*Client

// NewRing returns the clients of keys, each with its allowances full.
func NewRing(keys []APIKey) Ring {
	ring := make(Ring, 0, len(keys))
	for _, k := range keys {
		c := &Client{APIKey: k, hash: sha256.Sum256([]byte(k.Key))}
		if k.RPM > 0 {
			c.Requests = NewBucket(k.RPM)
		}
		if k.TPM > 0 {
			c.Tokens = NewBucket(k.TPM)
		}
		ring = append(ring, c)
	}
	return ring
}

// Find returns the client whose key is token, or nil. It compares SHA-256
// hashes in constant time, and all of them, so that neither the token's
// length nor how much of it matched nor which key it is shows in the time
// the answer takes.
func (ring Ring) Find(token string) *Client {
	h := sha256.Sum256([]byte(token))
	var found *Client
	for _, c := range ring {
		if subtle.ConstantTimeCompare(h[:], c.hash[:]) == 1 {
			found = c
		}
	}
	return found
}

// Bearer returns the token of an "Authorization: Bearer TOKEN" header.
func Bearer(h http.Header) (string, bool) {
	v := h.Get("Authorization")
	scheme, token, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// keyContext is the context key of a request's client.
type keyContext struct{}

// NewContext returns ctx carrying c, the client that authenticated the
// request.
func NewContext(ctx context.Context, c *Client) context.Context {
	return context.WithValue(ctx, keyContext{}, c)
}

// KeyFromContext returns the API key that authenticated the request whose
// context is ctx (its Name, Priority and limits), if keys are configured.
func KeyFromContext(ctx context.Context) (APIKey, bool) {
	c, ok := ctx.Value(keyContext{}).(*Client)
	if !ok {
		return APIKey{}, false
	}
	return c.APIKey, true
}

// ClientFrom returns the client ctx carries (NewContext), or nil.
func ClientFrom(ctx context.Context) *Client {
	c, _ := ctx.Value(keyContext{}).(*Client)
	return c
}

// Bucket is a token bucket that refills perMinute tokens a minute, evenly,
// and holds at most perMinute: a key idle for a minute may spend a whole
// minute's allowance at once, never more. It is safe for concurrent use.
type Bucket struct {
	mu       sync.Mutex
	capacity float64
	perSec   float64
	level    float64
	at       time.Time // when level was last brought up to date; zero: full
}

// NewBucket returns a full bucket of perMinute tokens.
func NewBucket(perMinute int) *Bucket {
	return &Bucket{capacity: float64(perMinute), perSec: float64(perMinute) / 60, level: float64(perMinute)}
}

// Take removes n tokens at now if the bucket holds them. If not, it takes
// nothing and returns how long until it would hold them; a request larger
// than the capacity can never pass and gets wait < 0.
func (b *Bucket) Take(now time.Time, n int) (ok bool, wait time.Duration) {
	need := float64(n)
	if need > b.capacity {
		return false, -1
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.at.IsZero() {
		if dt := now.Sub(b.at).Seconds(); dt > 0 { // a clock that steps back refills nothing
			b.level = math.Min(b.capacity, b.level+dt*b.perSec)
		}
	}
	if b.at.IsZero() || now.After(b.at) {
		b.at = now
	}
	if b.level >= need {
		b.level -= need
		return true, 0
	}
	return false, time.Duration((need - b.level) / b.perSec * float64(time.Second))
}
