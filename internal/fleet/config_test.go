package fleet

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseBackend(t *testing.T) {
	tests := []struct {
		name     string
		spec     string
		wantName string
		wantURL  string
		wantErr  string // a substring of the error; empty for success
	}{
		{"url only", "http://127.0.0.1:8001", "backend-7", "http://127.0.0.1:8001", ""},
		{"named", "a=http://127.0.0.1:8001", "a", "http://127.0.0.1:8001", ""},
		{"spaces trimmed", "  gpu-0=http://10.0.0.5:8000  ", "gpu-0", "http://10.0.0.5:8000", ""},
		{"path prefix", "east=https://llm.example.com:8443/pool/a/", "east", "https://llm.example.com:8443/pool/a", ""},
		{"default http port", "http://vllm-0", "backend-7", "http://vllm-0", ""},
		{"default https port", "https://vllm-0", "backend-7", "https://vllm-0", ""},
		{"ipv6", "http://[::1]:8000", "backend-7", "http://[::1]:8000", ""},
		{"upper-case scheme", "HTTP://h:1", "backend-7", "http://h:1", ""},
		{"name with colon", "rack1:gpu0=http://h:1", "rack1:gpu0", "http://h:1", ""},

		{"empty", "", "", "", "empty URL"},
		{"empty url", "a=", "", "", "empty URL"},
		{"empty name", "=http://h:1", "", "", "empty name"},
		{"no scheme", "localhost:8000", "", "", "must start with http:// or https://"},
		{"named without scheme", "a=localhost:8000", "", "", "must start with http:// or https://"},
		{"ftp", "ftp://h:21", "", "", "must start with http:// or https://"},
		{"no host", "http://", "", "", "no host"},
		{"port only", "http://:8000", "", "", "no host"},
		{"bad port", "http://h:port", "", "", "invalid port"},
		{"query", "http://h:1/?x=y", "", "", "has a query"},
		{"fragment", "http://h:1/#top", "", "", "has a fragment"},
		{"user info", "http://user:secret@h:1", "", "", "user info"},
		{"name with space", "my gpu=http://h:1", "", "", "printable ASCII without spaces"},
		{"name with control", "a\x00=http://h:1", "", "", "printable ASCII without spaces"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := ParseBackend(7, tt.spec)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("ParseBackend(%q) = %+v, want an error", tt.spec, b)
				}
				if !errors.Is(err, ErrInvalidBackend) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseBackend(%q) error = %v, want ErrInvalidBackend saying %q", tt.spec, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseBackend(%q): %v", tt.spec, err)
			}
			if b.Index != 7 || b.Name != tt.wantName || b.URL.String() != tt.wantURL || !b.Healthy() {
				t.Errorf("ParseBackend(%q) = {%d %q %q healthy=%v}, want {7 %q %q healthy=true}",
					tt.spec, b.Index, b.Name, b.URL, b.Healthy(), tt.wantName, tt.wantURL)
			}
		})
	}
}

func TestParseBackends(t *testing.T) {
	tests := []struct {
		name    string
		specs   []string
		want    []string
		wantErr string
	}{
		{"indexed in order", []string{"a=http://h:1", "http://h:2"}, []string{"a", "backend-1"}, ""},
		{"duplicate names", []string{"a=http://h:1", "a=http://h:2"}, nil, `both named "a"`},
		{"one URL twice", []string{"http://h:1", "x=http://h:1/"}, nil, "same URL http://h:1"},
		{"default name taken", []string{"backend-1=http://h:1", "http://h:2"}, nil, `both named "backend-1"`},
		{"bad spec", []string{"http://h:1", "h:2"}, nil, "must start with"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs, err := ParseBackends(tt.specs)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrInvalidBackend) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want ErrInvalidBackend saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, b := range bs {
				if b.Index != i || b.Name != tt.want[i] {
					t.Errorf("backend %d = {%d %q}, want {%d %q}", i, b.Index, b.Name, i, tt.want[i])
				}
			}
		})
	}
}

func TestLoadConfig(t *testing.T) {
	type backend struct{ name, url string }
	tests := []struct {
		name         string
		yaml         string
		wantBackends []backend
		wantScrape   time.Duration
		wantHealth   time.Duration
		wantErr      string
	}{
		{
			name: "full",
			yaml: `
backends:
  - name: a
    url: http://127.0.0.1:8001
  - name: b
    url: http://127.0.0.1:8002/
scrape_interval: 500ms
health_interval: 2s
`,
			wantBackends: []backend{{"a", "http://127.0.0.1:8001"}, {"b", "http://127.0.0.1:8002"}},
			wantScrape:   500 * time.Millisecond,
			wantHealth:   2 * time.Second,
		},
		{
			name:         "names default, intervals unset",
			yaml:         "backends:\n  - url: http://10.0.0.1:8000\n  - {url: 'https://gpu-2'}\n",
			wantBackends: []backend{{"backend-0", "http://10.0.0.1:8000"}, {"backend-1", "https://gpu-2"}},
		},
		{name: "empty file", yaml: "", wantErr: "empty file"},
		{name: "comments only", yaml: "# nothing here\n", wantErr: "empty file"},
		{name: "no backends", yaml: "scrape_interval: 1s\n", wantErr: "no backends"},
		{name: "unknown field", yaml: "backends: [{url: 'http://h:1'}]\nscrape_intervall: 1s\n",
			wantErr: "field scrape_intervall not found"},
		{name: "unknown backend field", yaml: "backends: [{url: 'http://h:1', weight: 2}]\n",
			wantErr: "field weight not found"},
		{name: "duration without unit", yaml: "backends: [{url: 'http://h:1'}]\nscrape_interval: 1\n",
			wantErr: "cannot unmarshal"},
		{name: "bad duration", yaml: "backends: [{url: 'http://h:1'}]\nhealth_interval: 1 sec\n",
			wantErr: "cannot unmarshal"},
		{name: "negative duration", yaml: "backends: [{url: 'http://h:1'}]\nhealth_interval: -1s\n",
			wantErr: "health_interval -1s must be positive"},
		{name: "duplicate names", yaml: "backends:\n  - {name: a, url: 'http://h:1'}\n  - {name: a, url: 'http://h:2'}\n",
			wantErr: `backends 1 and 2 are both named "a"`},
		{name: "bad url", yaml: "backends:\n  - {name: a, url: 'h:1'}\n",
			wantErr: "backend 1: invalid backend"},
		{name: "missing url", yaml: "backends:\n  - {name: a}\n", wantErr: "backend 1: no url"},
		{name: "bad name", yaml: "backends:\n  - {name: 'a b', url: 'http://h:1'}\n",
			wantErr: "without spaces"},
		{name: "not a mapping", yaml: "- http://h:1\n", wantErr: "cannot unmarshal"},
		{name: "two documents", yaml: "backends: [{url: 'http://h:1'}]\n---\nbackends: []\n",
			wantErr: "more than one YAML document"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kvroute.yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := LoadConfig(path)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want ErrInvalidConfig saying %q", err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), path) {
					t.Errorf("error %q does not name the file", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(cfg.Backends) != len(tt.wantBackends) {
				t.Fatalf("%d backends, want %d", len(cfg.Backends), len(tt.wantBackends))
			}
			for i, w := range tt.wantBackends {
				b := cfg.Backends[i]
				if b.Index != i || b.Name != w.name || b.URL.String() != w.url {
					t.Errorf("backend %d = {%d %q %q}, want {%d %q %q}", i, b.Index, b.Name, b.URL, i, w.name, w.url)
				}
			}
			if cfg.ScrapeInterval != tt.wantScrape || cfg.HealthInterval != tt.wantHealth {
				t.Errorf("intervals = %v, %v; want %v, %v", cfg.ScrapeInterval, cfg.HealthInterval, tt.wantScrape, tt.wantHealth)
			}
		})
	}

	t.Run("missing file", func(t *testing.T) {
		_, err := LoadConfig(filepath.Join(t.TempDir(), "nope.yaml"))
		if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrInvalidConfig) {
			t.Errorf("error = %v, want fs.ErrNotExist", err)
		}
	})
}
