package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestSecretRedacted(t *testing.T) {
	b := NewBackend(0, "a", &url.URL{Scheme: "http", Host: "h:1"})
	b.APIKey = "sk-very-secret"
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		if s := fmt.Sprintf(verb, b); strings.Contains(s, "sk-very-secret") {
			t.Errorf("%s of a backend shows its key: %s", verb, s)
		}
	}
	h := http.Header{"Authorization": {"Bearer client"}}
	b.Authorize(h)
	if got := h.Get("Authorization"); got != "Bearer sk-very-secret" {
		t.Errorf("Authorization = %q", got)
	}
	b.APIKey = ""
	h = http.Header{}
	b.Authorize(h)
	if _, ok := h["Authorization"]; ok {
		t.Error("a backend without a key set Authorization")
	}
}

func TestConfigAPIKeys(t *testing.T) {
	t.Setenv("KVROUTE_TEST_BACKEND_KEY", "from-env")
	tests := []struct {
		name    string
		yaml    string
		want    []string
		wantErr string
	}{
		{"inline and env", "backends:\n  - {url: 'http://h:1', api_key: k1}\n  - {url: 'http://h:2', api_key_env: KVROUTE_TEST_BACKEND_KEY}\n  - {url: 'http://h:3'}\n",
			[]string{"k1", "from-env", ""}, ""},
		{"both", "backends:\n  - {url: 'http://h:1', api_key: k1, api_key_env: KVROUTE_TEST_BACKEND_KEY}\n", nil, "not both"},
		{"unset env", "backends:\n  - {url: 'http://h:1', api_key_env: KVROUTE_TEST_UNSET_VARIABLE}\n", nil, "unset or empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kvroute.yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := LoadConfig(path)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want ErrInvalidConfig saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range tt.want {
				if got := string(cfg.Backends[i].APIKey); got != w {
					t.Errorf("backend %d key %q, want %q", i, got, w)
				}
			}
		})
	}
}

// TestProbesAuthorized runs the probes against a server that, like vLLM
// started with --api-key, answers 401 without the key.
func TestProbesAuthorized(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path] = r.Header.Get("Authorization")
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer backend-key" {
			http.Error(w, `{"error":"Unauthorized"}`, http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m"}]}`)
		case "/metrics":
			fmt.Fprint(w, "vllm:num_requests_running 0\n")
		default:
			fmt.Fprint(w, "ok")
		}
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	for _, key := range []Secret{"backend-key", ""} {
		b := NewBackend(0, "b", u)
		b.APIKey = key
		f := New([]*Backend{b}, Options{Logger: slog.New(slog.DiscardHandler)})
		f.Refresh(context.Background())
		if got, want := b.Info().Serves("m"), key != ""; got != want {
			t.Errorf("key %q: serves m = %v, want %v", key, got, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range []string{"/health", "/v1/models", "/metrics"} {
		if _, ok := seen[p]; !ok {
			t.Errorf("%s was not probed", p)
		}
	}
}
