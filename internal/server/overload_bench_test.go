package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/proxy"
)

// BenchmarkOverload offers two emulated H100s four times what they serve
// (1k-token prompts, 100 tokens out: about 64 requests a second between
// them) for 20 s, open loop, side by side:
//
//   - absorb: no cap, no deadline, as a classic balancer passes traffic on;
//   - deadline: kvroute's defaults, every request granting 3 s to its first
//     token (X-Kvroute-Deadline), refused at once when its best backend is
//     predicted to miss it;
//   - queue: the same, and at most 48 requests on a backend, the rest in the
//     router's queue (64, 2 s at most), then 429.
//
// It reports what clients see: the share refused, whether each refusal
// carried a Retry-After, the TTFT of the requests served and how many met
// 3 s (goodput), and the router's peak heap and goroutines. Run:
// go test ./internal/server -run '^$' -bench Overload -benchtime 1x
func BenchmarkOverload(b *testing.B) {
	for _, tt := range []struct {
		name     string
		over     proxy.Overload
		deadline string
	}{
		{"absorb", proxy.Overload{MaxPerBackend: -1, Admission: admission.Config{MaxInFlight: -1, MaxQueue: -1}}, ""},
		{"deadline", proxy.Overload{}, "3s"},
		{"queue", proxy.Overload{MaxPerBackend: 48, Admission: admission.Config{MaxQueue: 64, QueueTimeout: 2 * time.Second}}, "3s"},
	} {
		b.Run(tt.name, func(b *testing.B) {
			for b.Loop() {
				overload(b, tt.over, tt.deadline, 256, 20*time.Second)
			}
		})
	}
}

func overload(b *testing.B, over proxy.Overload, deadline string, rate float64, span time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var bs []*fleet.Backend
	var model string
	for i := range 2 {
		e, err := emulator.New(emulator.Config{Seed: uint64(i + 1)})
		if err != nil {
			b.Fatal(err)
		}
		go e.Run(ctx)
		ts := httptest.NewServer(e)
		defer ts.Close()
		model = e.Model()
		be, _ := fleet.ParseBackend(i, fmt.Sprintf("gpu%d=%s", i, ts.URL))
		bs = append(bs, be)
	}
	s, err := Start(ctx, Config{Backends: bs, Policy: "kvroute", Listen: "127.0.0.1:0", DrainDelay: -1,
		Proxy: proxy.Config{Overload: over}, Logger: testLoggerB()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()

	type result struct {
		status int
		retry  bool
		ttft   time.Duration
	}
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
		peak    runtime.MemStats
		peakG   int
	)
	stop := make(chan struct{})
	go func() { // the router's memory and goroutines, sampled
		var m runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			runtime.ReadMemStats(&m)
			mu.Lock()
			peak.HeapInuse = max(peak.HeapInuse, m.HeapInuse)
			peakG = max(peakG, runtime.NumGoroutine())
			mu.Unlock()
		}
	}()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	prompt := strings.Repeat("Summarise the state of the fleet once more, briefly. ", 80) // ~1k tokens
	start := time.Now()
	for i := 0; time.Since(start) < span; i++ {
		next := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		time.Sleep(time.Until(next))
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"%d %s"}],"max_tokens":100,"stream":true}`, model, i, prompt)
			req, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/chat/completions", strings.NewReader(body))
			if deadline != "" {
				req.Header.Set(proxy.HeaderDeadline, deadline)
			}
			sent := time.Now()
			res, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			r := result{status: res.StatusCode, retry: res.Header.Get("Retry-After") != ""}
			buf := make([]byte, 1)
			if _, err := io.ReadFull(res.Body, buf); err == nil {
				r.ttft = time.Since(sent)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		})
	}
	wg.Wait()
	close(stop)

	var ttfts []time.Duration
	refused, withRetry, met := 0, 0, 0
	for _, r := range results {
		switch r.status {
		case http.StatusOK:
			ttfts = append(ttfts, r.ttft)
			if r.ttft <= 3*time.Second {
				met++
			}
		case http.StatusTooManyRequests:
			refused++
			if r.retry {
				withRetry++
			}
		}
	}
	slices.Sort(ttfts)
	pct := func(q float64) float64 {
		if len(ttfts) == 0 {
			return 0
		}
		return ttfts[min(len(ttfts)-1, int(q*float64(len(ttfts))))].Seconds()
	}
	n := float64(len(results))
	b.ReportMetric(n, "requests")
	b.ReportMetric(float64(refused)/n, "refused/req")
	b.ReportMetric(float64(withRetry)/max(1, float64(refused)), "retry-after/refusal")
	b.ReportMetric(float64(met)/span.Seconds(), "goodput/s")
	b.ReportMetric(float64(met)/max(1, float64(len(ttfts))), "met/admitted")
	b.ReportMetric(pct(0.5), "ttft-p50-s")
	b.ReportMetric(pct(0.99), "ttft-p99-s")
	b.ReportMetric(float64(peak.HeapInuse)/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(peakG), "peak-goroutines")
}

func testLoggerB() *slog.Logger { return slog.New(slog.DiscardHandler) }
