package fleet

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
)

// emuClock is an emulator clock whose time moves only when the driver
// sleeps, so that the emulator's model time (and the GPU activity over its
// last second) does not depend on the machine's speed.
type emuClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *emuClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *emuClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	c.now = c.now.Add(d)
	ch := make(chan time.Time, 1)
	ch <- c.now
	c.mu.Unlock()
	return ch
}

// startEmulator serves a real emulator on a virtual clock until the test ends.
func startEmulator(t *testing.T) *httptest.Server {
	t.Helper()
	srv, err := emulator.New(emulator.Config{Logger: slog.New(slog.DiscardHandler),
		Clock: &emuClock{now: time.Unix(1_700_000_000, 0)}})
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
	return ts
}

// The GPU signals come from the emulator's own /metrics, where it exports
// the DCGM exporter's names.
func TestGPUSignalsFromBackendMetrics(t *testing.T) {
	ts := startEmulator(t)
	u, _ := url.Parse(ts.URL)
	b := NewBackend(0, "emu", u)
	log, logs := newTestLogger()
	f := New([]*Backend{b}, Options{Logger: log, Now: newFakeClock().Now})
	f.Refresh(t.Context())
	if m := f.Metrics(b); m == nil || m.GPUUtil != 0 || m.SMActive != 0 {
		t.Fatalf("idle: Metrics = %+v, want GPU utilisation 0:\n%s", m, logs)
	}
	body := `{"max_tokens":60,"prompt":"` + strings.Repeat("word ", 400) + `"}`
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	f.Refresh(t.Context())
	m := f.Metrics(b)
	if m == nil || !(m.GPUUtil > 0.2 && m.GPUUtil < 1) || !(m.SMActive > 0 && m.SMActive < m.GPUUtil) {
		t.Errorf("after 60 decode steps: Metrics = %+v, want GPU utilisation of a few tenths, SM activity below it", m)
	}
}

// dcgmNode is a node's DCGM exporter with two pods' GPUs.
const dcgmNode = `# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",container="vllm",namespace="llm",pod="vllm-a"} 80
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",pci_bus_id="00000000:19:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",container="vllm",namespace="llm",pod="vllm-b"} 20
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",container="vllm",namespace="llm",pod="vllm-a"} 0.8
`

// A backend without GPU metrics of its own (a plain vLLM) reads them from
// the GPU exporter its config names, only its own pod's series.
func TestGPUSignalsFromGPUMetricsURL(t *testing.T) {
	exporter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			t.Error("the backend's API key was sent to the GPU exporter")
		}
		_, _ = io.WriteString(w, dcgmNode)
	}))
	t.Cleanup(exporter.Close)
	tests := []struct {
		name, pod string
		want      float64
	}{
		{"whole node", "", 0.5},
		{"one pod", "vllm-b", 0.2},
		{"no such pod", "vllm-z", -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := newFakeBackend(t, vllmModels, vllmMetrics)
			yaml := "backends:\n  - url: " + fb.srv.URL + "\n    api_key: secret\n    gpu_metrics_url: " +
				exporter.URL + "/metrics\n"
			if tt.pod != "" {
				yaml += "    gpu_pod: " + tt.pod + "\n"
			}
			cfg, err := ParseConfig([]byte(yaml))
			if err != nil {
				t.Fatal(err)
			}
			b := cfg.Backends[0]
			log, logs := newTestLogger()
			f := New([]*Backend{b}, Options{Logger: log, Now: newFakeClock().Now})
			f.Refresh(t.Context())
			m := f.Metrics(b)
			if m == nil || m.GPUUtil != tt.want || m.SMActive != -1 {
				t.Errorf("Metrics = %+v, want GPUUtil %v and no SM activity:\n%s", m, tt.want, logs)
			}
		})
	}
	if _, err := ParseConfig([]byte("backends:\n  - url: http://a:1\n    gpu_metrics_url: ftp://x\n")); err == nil {
		t.Error("a gpu_metrics_url that is not http(s) was accepted")
	}
}

// Without any GPU metrics the signals read -1, not 0 (an idle GPU).
func TestGPUSignalsAbsent(t *testing.T) {
	var s scraper
	m, _, err := s.parse(strings.NewReader(vllmMetrics))
	if err != nil {
		t.Fatal(err)
	}
	if m.GPUUtil != -1 || m.SMActive != -1 {
		t.Errorf("GPUUtil, SMActive = %v, %v; want -1, -1", m.GPUUtil, m.SMActive)
	}
}
