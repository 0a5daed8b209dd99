package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/template"
	"time"
)

// Real classic load balancers, nginx and HAProxy, run as child processes on
// loopback in front of a fleet, so that `kvroute bench` measures what users
// run today exactly as it measures kvroute's own policies.

var (
	// ErrUnknownBalancer is returned for a kind that Balancers does not list.
	ErrUnknownBalancer = errors.New("unknown balancer kind")
	// ErrBalancerMissing is returned when the program a kind needs (nginx or
	// haproxy) is not installed.
	ErrBalancerMissing = errors.New("balancer program not installed")

	// errAddrInUse marks a start that failed because another process took
	// the chosen port between our probe and the child's bind.
	errAddrInUse = errors.New("address already in use")
)

const (
	// balancerStartTimeout bounds how long StartBalancer waits for the
	// child to answer its readiness probe.
	balancerStartTimeout = 10 * time.Second
	// balancerGrace is how long Close waits after SIGTERM before SIGKILL.
	// nginx's master escalates to SIGKILL for its own workers after about
	// a second, so a healthy child is gone well within it.
	balancerGrace = 5 * time.Second
	// balancerPoll is the readiness probe interval.
	balancerPoll = 20 * time.Millisecond
	// balancerTailLines is how many lines of the child's output an error
	// carries.
	balancerTailLines = 20
)

// balancerKind is one entry of Balancers.
type balancerKind struct {
	name    string
	program string // "nginx" or "haproxy"
	// method holds the balancing directives, one a line: of the nginx
	// upstream block (none is nginx's default round robin) or the HAProxy
	// backend section.
	method []string
}

var balancerKinds = []balancerKind{
	{"nginx-round-robin", "nginx", nil},
	{"nginx-least-conn", "nginx", []string{"least_conn;"}},
	{"nginx-hash", "nginx", []string{"hash $http_x_session_id consistent;"}},
	{"haproxy-roundrobin", "haproxy", []string{"balance roundrobin"}},
	{"haproxy-leastconn", "haproxy", []string{"balance leastconn"}},
	{"haproxy-hdr", "haproxy", []string{"balance hdr(X-Session-ID)", "hash-type consistent"}},
}

// Balancers lists the real balancer kinds StartBalancer runs:
//
//   - "nginx-round-robin", "nginx-least-conn": nginx's upstream round robin
//     and least_conn;
//   - "nginx-hash": nginx's `hash $http_x_session_id consistent` (ketama);
//     requests without X-Session-ID all hash the empty key, to one backend;
//   - "haproxy-roundrobin", "haproxy-leastconn": HAProxy's balance
//     roundrobin and leastconn;
//   - "haproxy-hdr": HAProxy's `balance hdr(X-Session-ID)` with `hash-type
//     consistent`; requests without the header fall back to round robin.
//
// None has active health checks or bounded load: these are the settings
// users run. The slice is fresh on every call.
func Balancers() []string {
	names := make([]string, len(balancerKinds))
	for i, k := range balancerKinds {
		names[i] = k.name
	}
	return names
}

func findBalancer(kind string) (balancerKind, bool) {
	for _, k := range balancerKinds {
		if k.name == kind {
			return k, true
		}
	}
	return balancerKind{}, false
}

// BalancerAvailable reports whether the program that kind needs is installed
// (in $PATH or /usr/sbin), and why not when it is not.
func BalancerAvailable(kind string) (bool, string) {
	k, ok := findBalancer(kind)
	if !ok {
		return false, unknownBalancer(kind).Error()
	}
	if _, err := lookProgram(k.program); err != nil {
		return false, err.Error()
	}
	return true, ""
}

func unknownBalancer(kind string) error {
	return fmt.Errorf("%w %q (want one of %s)", ErrUnknownBalancer, kind, strings.Join(Balancers(), ", "))
}

// lookProgram finds name in $PATH or, since Debian installs nginx and
// haproxy there and a normal user's $PATH lacks it, in /usr/sbin.
func lookProgram(name string) (string, error) {
	if path, err := exec.LookPath(name); err == nil {
		return path, nil
	}
	if path, err := exec.LookPath(filepath.Join("/usr/sbin", name)); err == nil {
		return path, nil
	}
	return "", fmt.Errorf("%w: %s is neither in $PATH nor in /usr/sbin (Debian: apt-get install %s)", ErrBalancerMissing, name, name)
}

// Balancer is a running nginx or HAProxy in front of a list of backends.
// Close must be called to stop it; Close is safe for concurrent use and may
// be called more than once.
type Balancer struct {
	// Kind is the balancer kind, one of Balancers.
	Kind string
	// URL is the base URL clients send requests to, e.g.
	// http://127.0.0.1:41234.
	URL string

	dir    string // temp dir holding the config and the child's files
	cmd    *exec.Cmd
	out    *childLog
	log    *slog.Logger
	cancel context.CancelFunc // stops the child: SIGTERM, then SIGKILL after balancerGrace

	// done is closed once the child has been waited for; waitErr and
	// unexpected are written before that.
	done       chan struct{}
	waitErr    error
	unexpected bool // it exited before it was asked to

	closeOnce sync.Once
	closeErr  error
}

// StartBalancer starts a balancer of kind in front of backends, base URLs
// like http://127.0.0.1:8000 (plain HTTP, no path), and returns once it
// answers HTTP on a free 127.0.0.1 port, or an error after at most 10 s. The
// config is generated in a fresh temp dir that Close removes; the child runs
// in the foreground and its output goes to logger (nil discards it), its
// last lines also into any start error. If the port is taken before the
// child binds it, StartBalancer retries once on another.
//
// The child runs until Close or until ctx is done, whichever is first, as
// StartFleet's servers do. An error wraps ErrUnknownBalancer or
// ErrBalancerMissing when those are the cause.
func StartBalancer(ctx context.Context, kind string, backends []string, logger *slog.Logger) (*Balancer, error) {
	k, ok := findBalancer(kind)
	if !ok {
		return nil, fmt.Errorf("bench: %w", unknownBalancer(kind))
	}
	servers, err := balancerServers(backends)
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", kind, err)
	}
	bin, err := lookProgram(k.program)
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", kind, err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("balancer", kind)
	b, err := startBalancer(ctx, k, bin, servers, logger)
	if errors.Is(err, errAddrInUse) {
		logger.Warn("balancer port was taken; retrying on another", "err", err)
		b, err = startBalancer(ctx, k, bin, servers, logger)
	}
	return b, err
}

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

// nginxConfig streams both ways unbuffered over HTTP/1.1 keep-alive
// upstream connections, like kvroute's proxy. One worker process: without
// a shared-memory zone every worker keeps its own round-robin position and
// connection counts, which would blur least_conn, and one event loop easily
// carries the bench's connections on a machine that also runs the fleet.
// All files live in the temp dir so that nginx never touches /var/lib/nginx
// or /var/log/nginx.
var nginxConfig = template.Must(template.New("nginx").Funcs(template.FuncMap{"path": nginxPath}).Parse(`# Generated by kvroute bench for {{.Kind}}; removed when the balancer stops.
daemon off;
master_process on;
{{- if .Root}}
# Run as root, the workers use the temp dir (0700) and need no nobody group.
user root;
{{- end}}
worker_processes 1;
pid {{path .Dir "nginx.pid"}};
lock_file {{path .Dir "nginx.lock"}};
error_log stderr warn;

events {
    worker_connections 4096;
}

http {
    access_log off;
    gzip off;
    default_type application/octet-stream;
    client_max_body_size 64m;
    client_body_temp_path {{path .Dir "client_body"}};
    proxy_temp_path {{path .Dir "proxy"}};
    fastcgi_temp_path {{path .Dir "fastcgi"}};
    uwsgi_temp_path {{path .Dir "uwsgi"}};
    scgi_temp_path {{path .Dir "scgi"}};

    upstream backends {
{{- range .Method}}
        {{.}}
{{- end}}
{{- range .Servers}}
        server {{.}};
{{- end}}
        # After the balancing method, as nginx requires.
        keepalive 256;
    }

    server {
        listen {{.Listen}};

        location = {{.Ready}} {
            return 200 "ready\n";
        }

        location / {
            proxy_pass http://backends;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_cache off;
            proxy_connect_timeout 5s;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
        }
    }
}
`))

// haproxyConfig keeps connections alive on both sides and streams: HAProxy
// forwards data as it arrives unless told to buffer (option
// http-buffer-request) or compress, and neither is set. One thread, like
// nginx's one worker; no server limit, so nothing queues in HAProxy.
var haproxyConfig = template.Must(template.New("haproxy").Parse(`# Generated by kvroute bench for {{.Kind}}; removed when the balancer stops.
global
    maxconn 8192
    nbthread 1

defaults
    mode http
    option http-keep-alive
    # Without it HAProxy sends with MSG_MORE while a response is unfinished,
    # and the kernel holds small SSE events up to 200 ms.
    option http-no-delay
    http-reuse safe
    timeout connect 5s
    timeout client 3600s
    timeout server 3600s

frontend balancer
    bind {{.Listen}}
    maxconn 8192
    monitor-uri {{.Ready}}
    default_backend backends

backend backends
{{- range .Method}}
    {{.}}
{{- end}}
{{- range $i, $s := .Servers}}
    server b{{$i}} {{$s}}
{{- end}}
`))

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

// startBalancer makes one attempt on a fresh port and temp dir.
func startBalancer(ctx context.Context, k balancerKind, bin string, servers []string, logger *slog.Logger) (*Balancer, error) {
	fail := func(err error) error { return fmt.Errorf("bench: %s: %w", k.name, err) }
	dir, err := os.MkdirTemp("", "kvroute-"+k.name+"-")
	if err != nil {
		return nil, fail(err)
	}
	port, err := balancerPort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fail(err)
	}
	c := balancerConfig{
		Kind:    k.name,
		Dir:     dir,
		Listen:  net.JoinHostPort("127.0.0.1", port),
		Ready:   "/.kvroute-ready-" + strings.ToLower(rand.Text()),
		Root:    os.Geteuid() == 0,
		Method:  k.method,
		Servers: servers,
	}
	name, text, err := k.render(c)
	conf := filepath.Join(dir, name)
	if err == nil {
		err = os.WriteFile(conf, text, 0o600)
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, fail(err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(runCtx, bin, k.args(dir, conf)...)
	cmd.Dir = dir
	out := &childLog{log: logger}
	cmd.Stdout, cmd.Stderr = out, out
	// Both stop cleanly on SIGTERM (nginx's master takes its workers
	// down); WaitDelay then SIGKILLs a child that lingers, and stops
	// waiting for output pipes that orphaned workers might still hold.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = balancerGrace
	if err := cmd.Start(); err != nil {
		cancel()
		os.RemoveAll(dir)
		return nil, fail(err)
	}
	b := &Balancer{
		Kind:   k.name,
		URL:    "http://" + c.Listen,
		dir:    dir,
		cmd:    cmd,
		out:    out,
		log:    logger,
		cancel: cancel,
		done:   make(chan struct{}),
	}
	go b.wait(runCtx)
	if err := b.waitReady(ctx, c.Ready); err != nil {
		b.cancel()
		<-b.done
		os.RemoveAll(dir)
		if strings.Contains(strings.ToLower(out.tailText()), "address already in use") {
			err = fmt.Errorf("%w: %w", errAddrInUse, err)
		}
		return nil, fail(fmt.Errorf("%w%s", err, out.tailBlock()))
	}
	logger.Info("balancer started", "url", b.URL, "pid", cmd.Process.Pid, "dir", dir)
	return b, nil
}

// balancerPort picks the port for a start; tests replace it.
var balancerPort = freePort

// freePort returns a loopback port that was free a moment ago.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), nil
}

// wait reaps the child.
func (b *Balancer) wait(ctx context.Context) {
	b.waitErr = b.cmd.Wait()
	b.unexpected = ctx.Err() == nil
	close(b.done)
}

// waitReady polls the balancer's own readiness path, which only our child
// answers with 200: a bare TCP connect could reach a process that took the
// port first.
func (b *Balancer) waitReady(ctx context.Context, path string) error {
	ctx, cancel := context.WithTimeout(ctx, balancerStartTimeout)
	defer cancel()
	go func() { // a probe in flight ends as soon as the child does
		select {
		case <-b.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	exited := func() error { return fmt.Errorf("exited while starting: %v", b.waitErr) }
	client := &http.Client{
		Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
		Timeout:   time.Second,
	}
	defer client.CloseIdleConnections()
	tick := time.NewTicker(balancerPoll)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.URL+path, nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-b.done:
			return exited()
		case <-ctx.Done():
			select {
			case <-b.done:
				return exited()
			default:
			}
			return fmt.Errorf("not ready after %v: %w", balancerStartTimeout, ctx.Err())
		case <-tick.C:
		}
	}
}

// Close stops the balancer (SIGTERM, then SIGKILL after 5 s), waits for it
// and removes its temp dir. It reports an error if the child had exited
// before it was asked to, or if the dir cannot be removed. Only the process
// started is signalled: should nginx's master need the SIGKILL, or die on
// its own by SIGKILL, its worker outlives it.
func (b *Balancer) Close() error {
	b.closeOnce.Do(func() {
		start := time.Now()
		b.cancel()
		<-b.done
		var errs []error
		switch {
		case b.unexpected:
			errs = append(errs, fmt.Errorf("bench: %s exited before Close: %v%s", b.Kind, b.waitErr, b.out.tailBlock()))
		case time.Since(start) >= balancerGrace:
			b.log.Warn("balancer ignored SIGTERM; killed", "grace", balancerGrace)
		default:
			b.log.Info("balancer stopped", "state", b.cmd.ProcessState)
		}
		if err := os.RemoveAll(b.dir); err != nil {
			errs = append(errs, fmt.Errorf("bench: %s: %w", b.Kind, err))
		}
		b.closeErr = errors.Join(errs...)
	})
	return b.closeErr
}

// childLog is a child's stdout and stderr: it logs each line at the level
// the line names and keeps the last lines for errors. Safe for concurrent
// use.
type childLog struct {
	log *slog.Logger

	mu   sync.Mutex
	part []byte   // an unfinished line
	tail []string // the last balancerTailLines lines
}

// Write logs every complete line in p.
func (c *childLog) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.part = append(c.part, p...)
	rest := c.part
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		c.line(string(rest[:i]))
		rest = rest[i+1:]
	}
	if len(rest) > 64<<10 { // no newline in sight: don't grow without bound
		c.line(string(rest))
		rest = nil
	}
	c.part = c.part[:copy(c.part, rest)]
	return len(p), nil
}

// line logs one line; c.mu is held.
func (c *childLog) line(s string) {
	s = strings.TrimRight(s, "\r ")
	if s == "" {
		return
	}
	if len(c.tail) == balancerTailLines {
		c.tail = append(c.tail[:0], c.tail[1:]...)
	}
	c.tail = append(c.tail, s)
	c.log.Log(context.Background(), childLevel(s), s)
}

// childLevel reads the level from nginx's "[warn]" or HAProxy's "[WARNING]".
func childLevel(s string) slog.Level {
	l := strings.ToLower(s)
	switch {
	case strings.Contains(l, "[emerg]"), strings.Contains(l, "[alert]"), strings.Contains(l, "[crit]"), strings.Contains(l, "[error]"):
		return slog.LevelError
	case strings.Contains(l, "[warn"):
		return slog.LevelWarn
	default:
		return slog.LevelInfo
	}
}

// tailText returns the last lines written, and any unfinished one.
func (c *childLog) tailText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	lines := append([]string(nil), c.tail...)
	if len(c.part) > 0 {
		lines = append(lines, string(c.part))
	}
	return strings.Join(lines, "\n")
}

// tailBlock is tailText set off for the end of an error message, or "".
func (c *childLog) tailBlock() string {
	t := c.tailText()
	if t == "" {
		return ""
	}
	return "; its output ended:\n" + t
}
