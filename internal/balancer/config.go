package balancer

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
)

// balancerServers turns base URLs into host:port strings for a config,
// rejecting anything the configs cannot express or that could inject
// directives into them.
func balancerServers(backends []string) ([]string, error) {
	if len(backends) == 0 {
		return nil, errors.New("no backends")
	}
	servers := make([]string, len(backends))
	for i, raw := range backends {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("backend %q: %w", raw, err)
		}
		if u.Scheme != "http" || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			return nil, fmt.Errorf("backend %q: want a plain HTTP base URL like http://127.0.0.1:8000", raw)
		}
		host, port := u.Hostname(), u.Port()
		if port == "" {
			port = "80"
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("backend %q: bad port %q", raw, port)
		}
		if host == "" || strings.ContainsAny(host, " \t\r\n;#{}\"'\\$") {
			return nil, fmt.Errorf("backend %q: bad host %q", raw, host)
		}
		servers[i] = net.JoinHostPort(host, port)
	}
	return servers, nil
}

// balancerConfig is what the config templates see.
type balancerConfig struct {
	Kind    string
	Dir     string
	Listen  string // 127.0.0.1:port
	Ready   string // path answered by the balancer itself, for the readiness probe
	Root    bool   // we run as root
	Method  []string
	Servers []string
}

// nginx.conf.tmpl streams responses unbuffered over HTTP/1.1 keep-alive
// upstream connections, like kvroute's proxy, and reads each request whole
// first so that it can retry it on another server: the operators' best
// retry and passive-health settings (proxy_next_upstream, max_fails) are on. One worker process: without
// a shared-memory zone every worker keeps its own round-robin position and
// connection counts, which would blur least_conn, and one event loop easily
// carries the bench's connections on a machine that also runs the fleet.
// All files live in the temp dir so that nginx never touches /var/lib/nginx
// or /var/log/nginx.
//
//go:embed nginx.conf.tmpl
var nginxText string

// nginxConfig is nginx.conf.tmpl parsed; its path function quotes a file
// in the temp dir.
var nginxConfig = template.Must(template.New("nginx").Funcs(template.FuncMap{"path": nginxPath}).Parse(nginxText))

// haproxy.cfg.tmpl keeps connections alive on both sides and streams
// responses: HAProxy forwards data as it arrives unless told to compress.
// Requests are buffered (option http-buffer-request), which L7 retries need:
// the operators' best retry and passive-health settings (retry-on, redispatch,
// observe layer7 with on-error mark-down) are on. One thread, like
// nginx's one worker; no server limit, so nothing queues in HAProxy.
//
//go:embed haproxy.cfg.tmpl
var haproxyText string

// haproxyConfig is haproxy.cfg.tmpl parsed.
var haproxyConfig = template.Must(template.New("haproxy").Parse(haproxyText))

// nginxPath is dir/name as a quoted nginx string.
func nginxPath(dir, name string) string {
	p := filepath.Join(dir, name)
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(p) + `"`
}

// render returns the kind's config file name and text for c.
func (k balancerKind) render(c balancerConfig) (string, []byte, error) {
	var (
		buf  bytes.Buffer
		name string
		err  error
	)
	switch k.program {
	case "nginx":
		name, err = "nginx.conf", nginxConfig.Execute(&buf, c)
	case "haproxy":
		name, err = "haproxy.cfg", haproxyConfig.Execute(&buf, c)
	default:
		err = fmt.Errorf("no config for program %q", k.program)
	}
	return name, buf.Bytes(), err
}

// args returns the child's arguments to run config file conf in dir.
func (k balancerKind) args(dir, conf string) []string {
	if k.program == "nginx" {
		// -e: startup errors to stderr too, not to the compiled-in
		// /var/log/nginx/error.log (nginx ≥ 1.19.5).
		return []string{"-p", dir + string(filepath.Separator), "-c", conf, "-e", "stderr"}
	}
	// -db: foreground, no master-worker.
	return []string{"-f", conf, "-db"}
}
