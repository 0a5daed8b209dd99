//go:build unix

package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/testfleet"
)

// startPD starts prefill and decode emulator processes and kvroute in front
// of them, every request split (the wire is what these tests check).
func startPD(t *testing.T, prefills, decodes int) (*Server, []*testfleet.Backend, []*testfleet.Backend) {
	t.Helper()
	pre := testfleet.Start(t, prefills, "--seed", "7", "--time-scale", "0.05", "--kv-role", "prefill")
	dec := testfleet.Start(t, decodes, "--seed", "7", "--time-scale", "0.05", "--kv-role", "decode")
	s := startRouter(t, dec, func(c *Config) {
		for i, e := range pre {
			b, err := fleet.ParseBackend(len(c.Backends), fmt.Sprintf("prefill%d=%s", i, e.URL()))
			if err != nil {
				t.Fatal(err)
			}
			b.SetRole(fleet.RolePrefill)
			c.Backends = append(c.Backends, b)
		}
		c.Proxy.Disagg.Splitter = router.SplitAlways{}
	})
	return s, pre, dec
}

// chatOnce sends a non-streamed chat request and returns its status, prompt
// and cached tokens.
func chatOnce(t *testing.T, url, text string) (status, prompt, cached int, body string) {
	body = fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":8}`, model, text)
	res, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return 0, 0, 0, ""
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	var r struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(data, &r)
	return res.StatusCode, r.Usage.PromptTokens, r.Usage.Details.CachedTokens, string(data)
}

// emulatorCounter sums a counter (or a histogram's count) of the emulators.
func emulatorCounter(t *testing.T, emus []*testfleet.Backend, name string) float64 {
	t.Helper()
	var sum float64
	for _, e := range emus {
		res, err := http.Get(e.URL() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		parser := expfmt.NewTextParser(pmodel.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(res.Body)
		res.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range fams[name].GetMetric() {
			sum += m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// TestDisaggLive sends requests through kvroute to prefill and decode
// emulator processes: every request completes, and each decode server
// pulled its prefill's KV with the parameters the prefill answered (a
// pull checks the prompt against the prefill server's); then, with one
// prefill server killed and the other failing every request, requests
// still complete, prefilled on the decode servers.
func TestDisaggLive(t *testing.T) {
	s, pre, dec := startPD(t, 2, 2)
	url := s.URL
	const n = 12
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, prompt, cached, body := chatOnce(t, url, fmt.Sprintf("document %d: %s", i, strings.Repeat("lorem ipsum dolor ", 300)))
			if status != http.StatusOK || cached != prompt-1 {
				t.Errorf("request %d: status %d, %d of %d prompt tokens pulled: %s", i, status, cached, prompt, body)
			}
		}()
	}
	wg.Wait()
	if got := emulatorCounter(t, dec, "vllm:nixl_xfer_time_seconds"); got != n {
		t.Errorf("decode servers pulled %v times, want %d", got, n)
	}
	if got := emulatorCounter(t, dec, "vllm:nixl_num_failed_transfers_total"); got != 0 {
		t.Errorf("%v failed pulls", got)
	}
	if got := emulatorCounter(t, pre, "vllm:request_success_total"); got != n {
		t.Errorf("prefill servers served %v requests, want %d", got, n)
	}

	pre[0].Kill()
	pre[1].SetFaults(emulator.Faults{Rate500: 1})
	for i := range 4 {
		status, _, cached, body := chatOnce(t, url, fmt.Sprintf("fallback %d: %s", i, strings.Repeat("sed do eiusmod ", 300)))
		if status != http.StatusOK || cached != 0 {
			t.Errorf("fallback request %d: status %d, %d cached: %s", i, status, cached, body)
		}
	}
	if got := emulatorCounter(t, dec, "vllm:nixl_xfer_time_seconds"); got != n {
		t.Errorf("decode servers pulled %v times after the prefill pool failed, want still %d", got, n)
	}
}

// TestDisaggLiveSGLang is TestDisaggLive the SGLang way: prefill servers
// with a bootstrap port (the emulator's HTTP port) get their leg at the
// same time as the decode servers, who meet them in the bootstrap room;
// with the prefill pool failing, the decode's wait ends in 503 and the
// request is retried whole on another decode server.
func TestDisaggLiveSGLang(t *testing.T) {
	pre := testfleet.Start(t, 2, "--seed", "7", "--time-scale", "0.05", "--kv-role", "prefill")
	dec := testfleet.Start(t, 2, "--seed", "7", "--time-scale", "0.05", "--kv-role", "decode", "--kv-bootstrap-timeout", "1s")
	s := startRouter(t, dec, func(c *Config) {
		for i, e := range pre {
			b, err := fleet.ParseBackend(len(c.Backends), fmt.Sprintf("prefill%d=%s", i, e.URL()))
			if err != nil {
				t.Fatal(err)
			}
			b.SetRole(fleet.RolePrefill)
			port, _ := strconv.Atoi(b.URL.Port())
			if err := b.SetBootstrapPort(port); err != nil {
				t.Fatal(err)
			}
			c.Backends = append(c.Backends, b)
		}
		c.Proxy.Disagg.Splitter = router.SplitAlways{}
	})
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, prompt, cached, body := chatOnce(t, s.URL, fmt.Sprintf("report %d: %s", i, strings.Repeat("ut enim ad minim ", 300)))
			if status != http.StatusOK || cached != prompt-1 {
				t.Errorf("request %d: status %d, %d of %d prompt tokens pulled: %s", i, status, cached, prompt, body)
			}
		}()
	}
	wg.Wait()
	if got := emulatorCounter(t, dec, "vllm:nixl_xfer_time_seconds"); got != n {
		t.Errorf("decode servers met %v prefills, want %d", got, n)
	}
	pre[0].Kill()
	pre[1].SetFaults(emulator.Faults{Rate500: 1})
	for i := range 3 {
		status, _, cached, body := chatOnce(t, s.URL, fmt.Sprintf("whole %d: %s", i, strings.Repeat("quis nostrud ", 300)))
		if status != http.StatusOK || cached != 0 {
			t.Errorf("fallback request %d: status %d, %d cached: %s", i, status, cached, body)
		}
	}
}
