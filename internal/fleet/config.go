package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"
	"unicode"

	yaml "go.yaml.in/yaml/v3"
)

var (
	// ErrInvalidBackend wraps every error about a backend spec or URL.
	ErrInvalidBackend = errors.New("invalid backend")
	// ErrInvalidConfig wraps every error about a config file's content.
	ErrInvalidConfig = errors.New("invalid config")
)

// Config is a fleet's configuration file.
type Config struct {
	// Backends are the backends in file order, indexed from 0.
	Backends []*Backend
	// ScrapeInterval and HealthInterval are the probe intervals; zero when
	// the file does not set them (Options then applies its defaults).
	ScrapeInterval, HealthInterval time.Duration
}

// fileConfig is Config as written in YAML.
type fileConfig struct {
	Backends []struct {
		Name string `yaml:"name"`
		URL  string `yaml:"url"`
		// APIKey and APIKeyEnv give the backend's own API key (see
		// backendKey): the key itself, or the name of the environment
		// variable that holds it.
		APIKey    string `yaml:"api_key"`
		APIKeyEnv string `yaml:"api_key_env"`
		// GPUMetricsURL and GPUPod locate the backend's GPU metrics
		// (Backend.GPUMetricsURL, Backend.GPUPod).
		GPUMetricsURL string `yaml:"gpu_metrics_url"`
		GPUPod        string `yaml:"gpu_pod"`
		// DPRanks, above 1, makes the backend that many data-parallel
		// ranks behind one URL (rank.go).
		DPRanks int `yaml:"dp_ranks"`
		// Role is the backend's part in prefill/decode disaggregation
		// (role.go): prefill, decode or both (the default).
		Role string `yaml:"role"`
		// BootstrapPort is a prefill server's SGLang bootstrap port
		// (role.go); 0 for vLLM's wire.
		BootstrapPort int `yaml:"bootstrap_port"`
	} `yaml:"backends"`
	// yaml.v3 parses time.Duration from strings such as "500ms" and rejects
	// bare numbers, which would be ambiguous.
	ScrapeInterval time.Duration `yaml:"scrape_interval"`
	HealthInterval time.Duration `yaml:"health_interval"`
}

// LoadConfig reads a YAML configuration file:
//
//	backends:
//	  - name: a                    # optional, defaults to backend-N (N: its index)
//	    url: http://127.0.0.1:8001
//	    api_key_env: GPU_A_KEY     # or api_key: KEY; sent as Authorization: Bearer
//	    gpu_metrics_url: http://10.0.0.5:9400/metrics  # optional: its DCGM exporter
//	    gpu_pod: vllm-a-0          # optional: only that pod's GPUs on the exporter
//	    role: decode               # optional: prefill, decode or both (the default)
//	    bootstrap_port: 8998       # optional: a prefill server's SGLang bootstrap port
//	  - url: http://127.0.0.1:8002
//	scrape_interval: 1s
//	health_interval: 1s
//
// Unknown fields, duplicate backend names, bad URLs and non-positive
// intervals are errors wrapping ErrInvalidConfig; a file that cannot be read
// is the os error, wrapped.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	cfg, err := parseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

func parseConfig(data []byte) (Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var fc fileConfig
	if err := dec.Decode(&fc); err != nil {
		if errors.Is(err, io.EOF) {
			return Config{}, fmt.Errorf("%w: empty file", ErrInvalidConfig)
		}
		return Config{}, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("%w: more than one YAML document", ErrInvalidConfig)
	}
	if fc.ScrapeInterval < 0 {
		return Config{}, fmt.Errorf("%w: scrape_interval %v must be positive", ErrInvalidConfig, fc.ScrapeInterval)
	}
	if fc.HealthInterval < 0 {
		return Config{}, fmt.Errorf("%w: health_interval %v must be positive", ErrInvalidConfig, fc.HealthInterval)
	}
	if len(fc.Backends) == 0 {
		return Config{}, fmt.Errorf("%w: no backends", ErrInvalidConfig)
	}
	cfg := Config{ScrapeInterval: fc.ScrapeInterval, HealthInterval: fc.HealthInterval}
	for i, e := range fc.Backends {
		if e.URL == "" {
			return Config{}, fmt.Errorf("%w: backend %d: no url", ErrInvalidConfig, i+1)
		}
		b, err := newBackend(i, e.Name, e.Name != "", e.URL)
		if err != nil {
			return Config{}, fmt.Errorf("%w: backend %d: %w", ErrInvalidConfig, i+1, err)
		}
		if b.APIKey, err = backendKey(e.APIKey, e.APIKeyEnv); err != nil {
			return Config{}, fmt.Errorf("%w: backend %d: %w", ErrInvalidConfig, i+1, err)
		}
		if b.GPUMetricsURL, err = gpuMetricsURL(e.GPUMetricsURL); err != nil {
			return Config{}, fmt.Errorf("%w: backend %d: %w", ErrInvalidConfig, i+1, err)
		}
		b.GPUPod = e.GPUPod
		role, err := ParseRole(e.Role)
		if err != nil {
			return Config{}, fmt.Errorf("%w: backend %d: %w", ErrInvalidConfig, i+1, err)
		}
		b.SetRole(role)
		if err := b.SetBootstrapPort(e.BootstrapPort); err != nil {
			return Config{}, fmt.Errorf("%w: backend %d: %w", ErrInvalidConfig, i+1, err)
		}
		b.Index = len(cfg.Backends)
		ranks, err := ExpandRanks(b, e.DPRanks)
		if err != nil {
			return Config{}, fmt.Errorf("%w: backend %d: %w", ErrInvalidConfig, i+1, err)
		}
		cfg.Backends = append(cfg.Backends, ranks...)
	}
	if err := uniqueNames(cfg.Backends); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return cfg, nil
}

// ParseBackend parses a backend spec, "[name=]URL", such as
// "gpu0=http://10.0.0.5:8000" or "http://127.0.0.1:8001/prefix". The URL
// must be http or https with a host, and may have a path prefix but no
// query, fragment or user info. The name defaults to "backend-N", N being
// index: the name is sent to clients in X-Kvroute-Backend and shown in
// metrics, and a default of host:port would publish the fleet's internal
// addresses. Errors wrap ErrInvalidBackend.
func ParseBackend(index int, spec string) (*Backend, error) {
	spec = strings.TrimSpace(spec)
	name, raw, named := "", spec, false
	// A name ends at the first "=" before the scheme; an "=" after it
	// belongs to the URL.
	if eq := strings.IndexByte(spec, '='); eq >= 0 {
		if sep := strings.Index(spec, "://"); sep < 0 || eq < sep {
			name, raw, named = spec[:eq], spec[eq+1:], true
		}
	}
	b, err := newBackend(index, name, named, raw)
	if err != nil {
		return nil, fmt.Errorf("backend %q: %w", spec, err)
	}
	return b, nil
}

// ParseBackends parses specs with ParseBackend, indexing them in order, and
// rejects duplicate names.
func ParseBackends(specs []string) ([]*Backend, error) {
	bs := make([]*Backend, 0, len(specs))
	for i, s := range specs {
		b, err := ParseBackend(i, s)
		if err != nil {
			return nil, err
		}
		bs = append(bs, b)
	}
	if err := uniqueNames(bs); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidBackend, err)
	}
	return bs, nil
}

// newBackend validates a name (when named) and a base URL and returns the
// backend. Errors wrap ErrInvalidBackend.
func newBackend(index int, name string, named bool, raw string) (*Backend, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return nil, fmt.Errorf("%w: empty URL", ErrInvalidBackend)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidBackend, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%w: URL %q must start with http:// or https://", ErrInvalidBackend, raw)
	case u.Hostname() == "":
		return nil, fmt.Errorf("%w: URL %q has no host", ErrInvalidBackend, raw)
	case u.User != nil:
		return nil, fmt.Errorf("%w: URL %q has user info; credentials in URLs end up in logs", ErrInvalidBackend, raw)
	case u.RawQuery != "" || u.ForceQuery:
		return nil, fmt.Errorf("%w: URL %q has a query; give a base URL", ErrInvalidBackend, raw)
	case u.Fragment != "":
		return nil, fmt.Errorf("%w: URL %q has a fragment; give a base URL", ErrInvalidBackend, raw)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	if !named {
		name = DefaultName(index)
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	return NewBackend(index, name, u), nil
}

// checkName accepts names that can go in a response header and a log line
// as they are: printable, without spaces.
func checkName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty name", ErrInvalidBackend)
	}
	for _, r := range name {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) || r > unicode.MaxASCII {
			return fmt.Errorf("%w: name %q must be printable ASCII without spaces", ErrInvalidBackend, name)
		}
	}
	return nil
}

// uniqueNames rejects two backends with one name: the name is how logs,
// headers and metrics tell backends apart. It also rejects one URL given
// twice, which the host:port default names used to catch: a backend listed
// twice would take twice its share.
func uniqueNames(bs []*Backend) error {
	seen := make(map[string]int, len(bs))
	urls := make(map[string]int, len(bs))
	for i, b := range bs {
		if j, dup := seen[b.Name]; dup {
			return fmt.Errorf("backends %d and %d are both named %q", j+1, i+1, b.Name)
		}
		seen[b.Name] = i
		u := endpoint(b) // rank.go: ranks share a URL
		if j, dup := urls[u]; dup {
			return fmt.Errorf("backends %d and %d have the same URL %s", j+1, i+1, u)
		}
		urls[u] = i
	}
	return nil
}

// ParseConfig reads a configuration file's content, as LoadConfig does.
func ParseConfig(data []byte) (Config, error) { return parseConfig(data) }

// gpuMetricsURL parses a backend's gpu_metrics_url: a full http or https
// URL of a metrics page, or nothing.
func gpuMetricsURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, nil
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return nil, fmt.Errorf("%w: gpu_metrics_url %q must be an http(s) URL with a host and no user info", ErrInvalidBackend, raw)
	}
	return u, nil
}
