// Package balancer runs classic load balancers, nginx and HAProxy, as child
// processes on loopback in front of a fleet, so that `kvroute bench`
// measures what users run today exactly as it measures kvroute's own
// policies. Their configs are generated from the templates nginx.conf.tmpl
// and haproxy.cfg.tmpl, embedded in the binary.
package balancer

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

var (
	// ErrUnknownKind is returned for a kind that Kinds does not list.
	ErrUnknownKind = errors.New("unknown balancer kind")
	// ErrNotInstalled is returned when the program a kind needs (nginx or
	// haproxy) is not installed.
	ErrNotInstalled = errors.New("balancer program not installed")

	// errAddrInUse marks a start that failed because another process took
	// the chosen port between our probe and the child's bind.
	errAddrInUse = errors.New("address already in use")
)

const (
	// balancerStartTimeout bounds how long Start waits for the
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

// Balancer is a running nginx or HAProxy in front of a list of backends.
// Close must be called to stop it; Close is safe for concurrent use and may
// be called more than once.
type Balancer struct {
	// Kind is the balancer kind, one of Kinds.
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

// Start starts a balancer of kind in front of backends, base URLs
// like http://127.0.0.1:8000 (plain HTTP, no path), and returns once it
// answers HTTP on a free 127.0.0.1 port, or an error after at most 10 s. The
// config is generated in a fresh temp dir that Close removes; the child runs
// in the foreground and its output goes to logger (nil discards it), its
// last lines also into any start error. If the port is taken before the
// child binds it, Start retries once on another.
//
// The child runs until Close or until ctx is done, whichever is first, as
// StartFleet's servers do. An error wraps ErrUnknownKind or
// ErrNotInstalled when those are the cause.
func Start(ctx context.Context, kind string, backends []string, logger *slog.Logger) (*Balancer, error) {
	k, ok := findKind(kind)
	if !ok {
		return nil, fmt.Errorf("balancer: %w", unknownKind(kind))
	}
	servers, err := balancerServers(backends)
	if err != nil {
		return nil, fmt.Errorf("balancer: %s: %w", kind, err)
	}
	bin, err := lookProgram(k.program)
	if err != nil {
		return nil, fmt.Errorf("balancer: %s: %w", kind, err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("balancer", kind)
	b, err := start(ctx, k, bin, servers, logger)
	if errors.Is(err, errAddrInUse) {
		logger.Warn("balancer port was taken; retrying on another", "err", err)
		b, err = start(ctx, k, bin, servers, logger)
	}
	return b, err
}

// start makes one attempt on a fresh port and temp dir.
func start(ctx context.Context, k balancerKind, bin string, servers []string, logger *slog.Logger) (*Balancer, error) {
	fail := func(err error) error { return fmt.Errorf("balancer: %s: %w", k.name, err) }
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

// PID is the process ID of the balancer's child (nginx's master, whose
// worker is its child; HAProxy itself), for benchmarks that pin it to a
// CPU or read its CPU time.
func (b *Balancer) PID() int { return b.cmd.Process.Pid }

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
			errs = append(errs, fmt.Errorf("balancer: %s exited before Close: %v%s", b.Kind, b.waitErr, b.out.tailBlock()))
		case time.Since(start) >= balancerGrace:
			b.log.Warn("balancer ignored SIGTERM; killed", "grace", balancerGrace)
		default:
			b.log.Info("balancer stopped", "state", b.cmd.ProcessState)
		}
		if err := os.RemoveAll(b.dir); err != nil {
			errs = append(errs, fmt.Errorf("balancer: %s: %w", b.Kind, err))
		}
		b.closeErr = errors.Join(errs...)
	})
	return b.closeErr
}
