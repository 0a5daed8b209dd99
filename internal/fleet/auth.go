package fleet

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
)

// Secret is a credential. It prints as "[redacted]" with fmt's verbs
// (%v, %+v, %#v, %s) so that a backend logged or shown in a test failure
// does not give its key away; convert to string to use it.
type Secret string

// redacted is how a set Secret prints.
const redacted = "[redacted]"

// String implements fmt.Stringer.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString implements fmt.GoStringer, for %#v.
func (s Secret) GoString() string { return strconv.Quote(s.String()) }

// Authorize sets b's API key on h as "Authorization: Bearer KEY", replacing
// any Authorization already there. Without a key it leaves h alone.
func (b *Backend) Authorize(h http.Header) {
	if b.APIKey != "" {
		h.Set("Authorization", "Bearer "+string(b.APIKey))
	}
	b.setRank(h) // rank.go
}

// DefaultName is the name of the backend at index that was given no name:
// "backend-N". It is not the backend's host:port because the name is sent
// to clients (X-Kvroute-Backend) and the addresses of the fleet are not
// theirs to know.
func DefaultName(index int) string { return "backend-" + strconv.Itoa(index) }

// backendKey resolves a backend's API key given as the key itself or as the
// name of an environment variable holding it; setting both, or naming an
// unset or empty variable, is an error (a key the operator meant to set but
// did not would surface only as 401s from the backend).
func backendKey(key, env string) (Secret, error) {
	switch {
	case key != "" && env != "":
		return "", fmt.Errorf("give api_key or api_key_env, not both")
	case env != "":
		return SecretFromEnv(env)
	}
	return Secret(key), nil
}

// SecretFromEnv returns the value of the environment variable name, which
// must be set and not empty.
func SecretFromEnv(name string) (Secret, error) {
	v := os.Getenv(name)
	if v == "" {
		return "", fmt.Errorf("environment variable %s is unset or empty", name)
	}
	return Secret(v), nil
}
