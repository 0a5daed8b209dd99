package fleet

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/emulator"
)

// The fleet understands the real emulator: its /v1/models, /health and
// vLLM-named /metrics.
func TestEmulator(t *testing.T) {
	srv, err := emulator.New(emulator.Config{
		TimeScale: 1e-4, // a request takes microseconds of wall time
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx) }()
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.Close()
		cancel()
		<-ran
	})

	u, _ := url.Parse(ts.URL)
	b := NewBackend(0, "emu", u)
	clock := newFakeClock()
	log, logs := newTestLogger()
	f := New([]*Backend{b}, Options{Logger: log, Now: clock.Now})
	f.Refresh(ctx)

	info := b.Info()
	if info == nil {
		t.Fatalf("emulator not discovered:\n%s", logs)
	}
	p := srv.Profile()
	if !slices.Equal(info.Models, []string{srv.Model()}) {
		t.Errorf("Models = %q, want [%q]", info.Models, srv.Model())
	}
	if info.BlockSize != p.BlockSize || info.KVBlocks != p.Blocks() {
		t.Errorf("BlockSize, KVBlocks = %d, %d; want %d, %d", info.BlockSize, info.KVBlocks, p.BlockSize, p.Blocks())
	}
	m := f.Metrics(b)
	if m == nil {
		t.Fatalf("no metrics:\n%s", logs)
	}
	if m.Running != 0 || m.Waiting != 0 || m.KVUsage != 0 || m.PrefixQueries != 0 {
		t.Errorf("idle emulator Metrics = %+v", *m)
	}

	// One request later the prefix cache has been queried.
	body := `{"model":"` + srv.Model() + `","max_tokens":4,` +
		`"messages":[{"role":"user","content":"Name three prime numbers."}]}`
	resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat completion: %s", resp.Status)
	}
	f.Refresh(ctx)
	if m := f.Metrics(b); m == nil || m.PrefixQueries <= 0 || m.KVUsage < 0 {
		t.Errorf("after a request Metrics = %+v, want prefix-cache queries and a KV usage", m)
	}
	if !b.Healthy() || !f.Ready() {
		t.Error("emulator not healthy and ready")
	}
}
