//go:build unix

// Package testfleet runs fleets of real `kvroute emulate` processes for
// tests: each backend is its own OS process on a loopback port, so tests can
// kill, freeze, restart and fault it and watch what a router sees on real
// sockets. Import it from _test.go files only.
//
// The kvroute binary is built once per test binary (go build, on first use)
// into a temporary directory; call Cleanup from TestMain to remove it.
// Every process a test starts is killed when the test ends. Each function
// and method that can fail fails the test (t.Fatal), so call them from the
// test's goroutine; every wait is bounded.
package testfleet

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
)

// Bounds of the waits.
const (
	buildTimeout = 5 * time.Minute
	// startTimeout bounds a process's start: until it prints its address
	// and answers /health.
	startTimeout = 30 * time.Second
	// exitTimeout bounds the wait for a process to die after SIGKILL.
	exitTimeout = 10 * time.Second
	// termTimeout bounds the wait after SIGTERM: the emulator lets
	// requests in flight finish for 10 s before it cuts them.
	termTimeout = 20 * time.Second
	// adminTimeout bounds a call to /admin/faults.
	adminTimeout = 5 * time.Second
	// stderrTail is how much of a process's stderr is kept for failure
	// messages, in bytes.
	stderrTail = 16 << 10
)

var build struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// Binary returns the path of a kvroute binary built from this module, building
// it on the first call. It fails t if the build fails. Safe for concurrent
// use.
func Binary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		gobin, err := exec.LookPath("go")
		if err != nil {
			build.err = fmt.Errorf("testfleet: no go command to build kvroute with: %w", err)
			return
		}
		if build.dir, err = os.MkdirTemp("", "kvroute-testfleet-"); err != nil {
			build.err = err
			return
		}
		path := filepath.Join(build.dir, "kvroute")
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, gobin, "build", "-o", path, "github.com/kvroute/kvroute/cmd/kvroute")
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("testfleet: go build kvroute: %w\n%s", err, out)
			return
		}
		build.path = path
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.path
}

// Cleanup removes the binary Binary built, if any. Call it from TestMain
// after m.Run; without it the binary stays in the temporary directory.
func Cleanup() {
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
}

// Backend is one `kvroute emulate` process serving one replica on a fixed
// loopback port, which survives restarts. Its methods must be called from
// the test's goroutine.
type Backend struct {
	t    testing.TB
	bin  string
	args []string // the caller's emulate flags
	port int      // 0 until the first process has picked one
	url  string

	mu   sync.Mutex
	proc *process // the current process
}

// process is one run of the emulator.
type process struct {
	cmd    *exec.Cmd
	done   chan struct{} // closed once the process has exited and been reaped
	stderr *tail
}

// Start starts n backends, each a `kvroute emulate` process with args (any
// emulate flags but --host, --port and --replicas, which testfleet sets), on
// free loopback ports, and waits until each answers /health. They are
// killed when the test ends.
func Start(t testing.TB, n int, args ...string) []*Backend {
	t.Helper()
	bs := make([]*Backend, n)
	for i := range bs {
		bs[i] = StartOne(t, args...)
	}
	return bs
}

// StartOne starts one backend with args, as Start does.
func StartOne(t testing.TB, args ...string) *Backend {
	t.Helper()
	b := &Backend{t: t, bin: Binary(t), args: append([]string(nil), args...)}
	t.Cleanup(b.cleanup)
	b.start()
	return b
}

// URL returns the backend's base URL, http://127.0.0.1:PORT. It stays the
// same across restarts.
func (b *Backend) URL() string { return b.url }

// Addr returns the backend's host:port.
func (b *Backend) Addr() string { return strings.TrimPrefix(b.url, "http://") }

// Pid returns the process ID of the current process.
func (b *Backend) Pid() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.proc.cmd.Process.Pid
}

// Exited reports whether the current process has exited.
func (b *Backend) Exited() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.proc.exited()
}

// Kill sends SIGKILL, as a crash or the OOM killer would, and waits until
// the process is gone: new connections are then refused.
func (b *Backend) Kill() {
	b.t.Helper()
	b.signal(syscall.SIGKILL, exitTimeout)
}

// Term sends SIGTERM and waits until the process has shut down gracefully
// (in-flight requests get up to 10 s).
func (b *Backend) Term() {
	b.t.Helper()
	b.signal(syscall.SIGTERM, termTimeout)
}

// Stop sends SIGSTOP: the process freezes with its sockets open, so the
// kernel still accepts connections but nothing answers, like a wedged
// server or a long GC pause. On Linux it waits until the process is stopped.
func (b *Backend) Stop() {
	b.t.Helper()
	b.signal(syscall.SIGSTOP, 0)
	pid := b.Pid()
	stat := fmt.Sprintf("/proc/%d/stat", pid)
	deadline := time.Now().Add(exitTimeout)
	for time.Now().Before(deadline) {
		data, err := os.ReadFile(stat)
		if err != nil {
			return // not Linux, or gone: nothing to wait for
		}
		// The state follows the parenthesised command name.
		if i := bytes.LastIndexByte(data, ')'); i >= 0 && i+2 < len(data) && (data[i+2] == 'T' || data[i+2] == 't') {
			return
		}
		time.Sleep(time.Millisecond)
	}
	b.t.Fatalf("testfleet: %s (pid %d) did not stop within %v", b.url, pid, exitTimeout)
}

// Cont sends SIGCONT to a stopped process.
func (b *Backend) Cont() {
	b.t.Helper()
	b.signal(syscall.SIGCONT, 0)
}

// Restart starts a new process on the same port with the same flags and
// waits until it answers /health; a process still running is killed first.
// The new process starts with an empty cache and the flags' faults.
func (b *Backend) Restart() {
	b.t.Helper()
	b.mu.Lock()
	p := b.proc
	b.mu.Unlock()
	if !p.exited() {
		b.Kill()
	}
	b.start()
}

// Faults returns the backend's faults, read from GET /admin/faults.
func (b *Backend) Faults() emulator.Faults {
	b.t.Helper()
	return b.admin(http.MethodGet, nil)
}

// SetFaults replaces the backend's faults through PUT /admin/faults (the
// emulator's --admin must be on, as it is by default).
func (b *Backend) SetFaults(f emulator.Faults) {
	b.t.Helper()
	if got := b.admin(http.MethodPut, &f); got != f {
		b.t.Fatalf("testfleet: %s: PUT /admin/faults answered %+v, want %+v", b.url, got, f)
	}
}

func (b *Backend) admin(method string, f *emulator.Faults) emulator.Faults {
	b.t.Helper()
	var body io.Reader
	if f != nil {
		data, err := json.Marshal(f)
		if err != nil {
			b.t.Fatal(err)
		}
		body = bytes.NewReader(data)
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, b.url+"/admin/faults", body)
	if err != nil {
		b.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.t.Fatalf("testfleet: %s %s/admin/faults: %v", method, b.url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var got emulator.Faults
	if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &got) != nil {
		b.t.Fatalf("testfleet: %s %s/admin/faults: %d %s", method, b.url, resp.StatusCode, data)
	}
	return got
}

// signal sends sig to the current process and, if wait > 0, waits that long
// for it to exit.
func (b *Backend) signal(sig syscall.Signal, wait time.Duration) {
	b.t.Helper()
	b.mu.Lock()
	p := b.proc
	b.mu.Unlock()
	if p.exited() {
		if wait > 0 {
			return
		}
		b.t.Fatalf("testfleet: %s: cannot send %v: the process has exited\n%s", b.url, sig, p.stderr)
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		b.t.Fatalf("testfleet: %s: %v: %v", b.url, sig, err)
	}
	if wait == 0 {
		return
	}
	select {
	case <-p.done:
	case <-time.After(wait):
		b.t.Fatalf("testfleet: %s (pid %d) did not exit within %v of %v\n%s", b.url, p.cmd.Process.Pid, wait, sig, p.stderr)
	}
}

// cleanup kills the current process, whatever its state, and reaps it.
func (b *Backend) cleanup() {
	b.mu.Lock()
	p := b.proc
	b.mu.Unlock()
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(exitTimeout):
		b.t.Errorf("testfleet: %s (pid %d) did not die after SIGKILL", b.url, p.cmd.Process.Pid)
	}
}

// start runs a new process on b.port (a free one the first time) and waits
// until it answers /health. A port the previous process held may take a
// moment to be free again, so "address already in use" is retried.
func (b *Backend) start() {
	b.t.Helper()
	deadline := time.Now().Add(startTimeout)
	for {
		p, url, err := b.launch(deadline)
		if err == nil {
			b.mu.Lock()
			b.proc, b.url = p, url
			b.mu.Unlock()
			if b.port == 0 {
				b.port = portOf(url)
			}
			b.waitHealthy(p, deadline)
			return
		}
		if b.port != 0 && strings.Contains(p.stderr.String(), "address already in use") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		b.t.Fatalf("testfleet: kvroute emulate %s: %v\n%s", strings.Join(p.cmd.Args[2:], " "), err, p.stderr)
	}
}

// launch starts one process and reads its address from its stdout. On error
// the process has exited or been killed.
func (b *Backend) launch(deadline time.Time) (*process, string, error) {
	args := append([]string{"emulate"}, b.args...)
	// Last, so that they win over the caller's.
	args = append(args, "--host", "127.0.0.1", "--port", strconv.Itoa(b.port), "--replicas", "1")
	p := &process{cmd: exec.Command(b.bin, args...), done: make(chan struct{}), stderr: &tail{}}
	p.cmd.Stderr = p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return p, "", err
	}
	if err := p.cmd.Start(); err != nil {
		close(p.done)
		return p, "", err
	}
	urls := make(chan string, 1)
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if u, ok := listening(sc.Text()); ok {
				select {
				case urls <- u:
				default:
				}
			}
		}
	}()
	go func() {
		<-read // Wait must not run before stdout is drained
		_ = p.cmd.Wait()
		close(p.done)
	}()
	select {
	case u := <-urls:
		return p, u, nil
	case <-p.done:
		return p, "", fmt.Errorf("exited before listening: %v", p.cmd.ProcessState)
	case <-time.After(time.Until(deadline)):
		_ = p.cmd.Process.Kill()
		<-p.done
		return p, "", fmt.Errorf("printed no address within %v", startTimeout)
	}
}

// waitHealthy polls /health until the process answers, with any status:
// a backend started with --fault-health-fail answers 503.
func (b *Backend) waitHealthy(p *process, deadline time.Time) {
	b.t.Helper()
	client := &http.Client{Timeout: time.Second}
	for {
		resp, err := client.Get(b.url + "/health")
		if err == nil {
			resp.Body.Close()
			return
		}
		if p.exited() || time.Now().After(deadline) {
			b.t.Fatalf("testfleet: %s did not answer /health: %v\n%s", b.url, err, p.stderr)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// listening parses the line `kvroute emulate` prints for each replica:
// "listening replica=0 url=http://127.0.0.1:PORT".
func listening(line string) (string, bool) {
	rest, ok := strings.CutPrefix(line, "listening ")
	if !ok {
		return "", false
	}
	for f := range strings.FieldsSeq(rest) {
		if u, ok := strings.CutPrefix(f, "url="); ok {
			return u, true
		}
	}
	return "", false
}

func portOf(url string) int {
	_, port, err := net.SplitHostPort(strings.TrimPrefix(url, "http://"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(port)
	return n
}

// tail keeps the last stderrTail bytes written to it. Safe for concurrent
// use.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - stderrTail; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
