//go:build unix

package testfleet

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
)

func TestMain(m *testing.M) {
	code := m.Run()
	Cleanup()
	os.Exit(code)
}

// noAnswer bounds how long a test waits to see that a backend does not
// answer.
const noAnswer = 300 * time.Millisecond

// complete sends a small completion to b under a deadline and returns the
// status, or the error.
var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

func complete(b *Backend, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.URL()+"/v1/completions",
		strings.NewReader(`{"prompt":"hello there","max_tokens":4}`))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	// A fresh connection each time: a kept-alive one to a killed backend
	// fails with EOF, not with the refused dial the test looks for.
	resp, err := noKeepAlive.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.ReadAll(resp.Body); err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

func mustComplete(t *testing.T, b *Backend) {
	t.Helper()
	code, err := complete(b, 10*time.Second)
	if err != nil || code != http.StatusOK {
		t.Fatalf("%s: status %d, error %v", b.URL(), code, err)
	}
}

func TestKillAndRestart(t *testing.T) {
	bs := Start(t, 2, "--time-scale", "0.01", "--seed", "1")
	if bs[0].URL() == bs[1].URL() || bs[0].Pid() == bs[1].Pid() {
		t.Fatalf("two backends share %s", bs[0].URL())
	}
	for _, b := range bs {
		mustComplete(t, b)
	}

	url, pid := bs[0].URL(), bs[0].Pid()
	bs[0].Kill()
	if !bs[0].Exited() {
		t.Fatal("killed backend still running")
	}
	if _, err := complete(bs[0], 5*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("request to a killed backend: %v, want connection refused", err)
	}
	mustComplete(t, bs[1]) // the other one is unaffected

	bs[0].Restart()
	if bs[0].URL() != url || bs[0].Pid() == pid {
		t.Fatalf("restarted at %s pid %d, was %s pid %d", bs[0].URL(), bs[0].Pid(), url, pid)
	}
	mustComplete(t, bs[0])
}

func TestStopCont(t *testing.T) {
	b := StartOne(t, "--time-scale", "0.01")
	b.Stop()
	if _, err := complete(b, noAnswer); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("request to a stopped backend: %v, want no answer", err)
	}
	b.Cont()
	mustComplete(t, b)
}

func TestFaultsAndTerm(t *testing.T) {
	b := StartOne(t, "--time-scale", "0.01", "--fault-500-rate", "1")
	if got := b.Faults(); got.Rate500 != 1 {
		t.Fatalf("faults %+v, want rate_500 1 from the flag", got)
	}
	if code, err := complete(b, 10*time.Second); err != nil || code != http.StatusInternalServerError {
		t.Fatalf("status %d, error %v; want 500", code, err)
	}
	b.SetFaults(emulator.Faults{Hang: true})
	if _, err := complete(b, noAnswer); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("request to a hung backend: %v, want no answer", err)
	}
	b.SetFaults(emulator.Faults{})
	mustComplete(t, b)
	b.Term()
	if !b.Exited() {
		t.Fatal("backend still running after SIGTERM")
	}
}

func TestListening(t *testing.T) {
	tests := []struct {
		line, want string
		ok         bool
	}{
		{"listening replica=0 url=http://127.0.0.1:8001", "http://127.0.0.1:8001", true},
		{"listening replica=3 url=http://127.0.0.1:1 extra=1", "http://127.0.0.1:1", true},
		{"time=x level=INFO msg=\"emulating vLLM\" url=http://127.0.0.1:8001", "", false},
		{"listening replica=0", "", false},
	}
	for _, tt := range tests {
		got, ok := listening(tt.line)
		if got != tt.want || ok != tt.ok {
			t.Errorf("listening(%q) = %q, %v; want %q, %v", tt.line, got, ok, tt.want, tt.ok)
		}
	}
}
