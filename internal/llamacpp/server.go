package llamacpp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"sync"
	"time"
)

// ServerConfig configures one llama-server.
type ServerConfig struct {
	// Model is the GGUF file to serve; Alias the model id it is served as
	// (default "random-llama").
	Model, Alias string
	// Context is the KV cache size in tokens, shared by the slots (each
	// slot gets Context/Slots); default 16384.
	Context int
	// Slots is the number of requests decoded in parallel (default 4).
	Slots int
	// Threads is the CPU threads it computes with (default 1).
	Threads int
	// Ready bounds the wait for the model to load (default 2 minutes).
	Ready time.Duration
}

func (c *ServerConfig) defaults() {
	if c.Alias == "" {
		c.Alias = "random-llama"
	}
	if c.Context <= 0 {
		c.Context = 16384
	}
	if c.Slots <= 0 {
		c.Slots = 4
	}
	if c.Threads <= 0 {
		c.Threads = 1
	}
	if c.Ready <= 0 {
		c.Ready = 2 * time.Minute
	}
}

// Server is a running llama-server on a loopback port.
type Server struct {
	// URL is its base URL (http://127.0.0.1:PORT).
	URL string

	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{}
	once   sync.Once
}

// Start starts llama-server on a free loopback port and waits until it has
// loaded the model and answers /health. The server is killed when ctx ends
// or Close is called, and (on Linux) if this process dies.
func (in Install) Start(ctx context.Context, cfg ServerConfig) (*Server, error) {
	cfg.defaults()
	// The port is free when we ask; another process may take it before the
	// server binds it, so a server that exits at once is retried.
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s, err := in.start(ctx, cfg, port)
		if err == nil {
			return s, nil
		}
		lastErr = err
		if !errors.Is(err, errExited) {
			break
		}
	}
	return nil, lastErr
}

var errExited = errors.New("llama-server exited")

func (in Install) start(ctx context.Context, cfg ServerConfig, port int) (*Server, error) {
	args := []string{
		"-m", cfg.Model, "-a", cfg.Alias,
		"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"-c", strconv.Itoa(cfg.Context), "-np", strconv.Itoa(cfg.Slots), "-t", strconv.Itoa(cfg.Threads),
		"--metrics", "--slots", "--no-webui", "--chat-template", "chatml", "--no-jinja",
	}
	cmd := exec.CommandContext(ctx, in.Server, args...)
	s := &Server{URL: "http://127.0.0.1:" + strconv.Itoa(port), cmd: cmd, out: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = s.out, s.out
	cmd.SysProcAttr = dieWithParent()
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("llamacpp: starting %s: %w", in.Server, err)
	}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	if err := s.waitReady(ctx, cfg.Ready); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// waitReady polls /health until it answers 200 (llama-server answers 503
// while it loads the model).
func (s *Server) waitReady(ctx context.Context, limit time.Duration) error {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	client := &http.Client{Timeout: time.Second}
	for {
		resp, err := client.Get(s.URL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.exited:
			return fmt.Errorf("llamacpp: %w before it was ready:\n%s", errExited, s.out.tail(2048))
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("llamacpp: %s not ready after %v:\n%s", s.URL, limit, s.out.tail(2048))
		case <-tick.C:
		}
	}
}

// Log returns the end of the server's output, for diagnosing failures.
func (s *Server) Log() string { return s.out.tail(4096) }

// Close kills the server and waits for it to exit. Calling it again does
// nothing.
func (s *Server) Close() {
	s.once.Do(func() {
		if s.cmd.Process != nil {
			_ = s.cmd.Process.Kill()
		}
		<-s.exited
	})
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// syncBuffer keeps a process's output; the process writes while tests read.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	// Keep the last megabyte: a long run logs every request.
	if b.buf.Len() > 1<<20 {
		keep := append([]byte(nil), b.buf.Bytes()[b.buf.Len()-512<<10:]...)
		b.buf.Reset()
		b.buf.Write(keep)
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.buf.Bytes()
	return string(out[max(0, len(out)-n):])
}
