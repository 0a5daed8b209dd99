package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/upstream"
)

// stampedBackend streams events events per request, one every gap; each
// event carries its send time (Unix nanoseconds, this process's clock) so
// the client can measure its delivery latency. Streams wait on hold (if not
// nil) before their last event, so that a test can count them while open.
func stampedBackend(events int, gap time.Duration, hold *sync.WaitGroup, release <-chan struct{}) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := range events {
			if i == events-1 && hold != nil {
				hold.Done()
				<-release
			}
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}],\"sent\":%d}\n\n", i, time.Now().UnixNano())
			if rc.Flush() != nil {
				return
			}
			time.Sleep(gap)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
}

// openStreams starts n streaming requests to target, each at a random
// moment within spread, and returns the delivery latency of every event
// after each stream's first (receive time − send time).
func openStreams(b *testing.B, client *http.Client, target string, n int, spread time.Duration) []time.Duration {
	var (
		mu   sync.Mutex
		lats []time.Duration
		wg   sync.WaitGroup
	)
	body := `{"model":"m","messages":[{"role":"user","content":"Hello there"}],"stream":true,"stream_options":{"include_usage":true}}`
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if spread > 0 {
				time.Sleep(rand.N(spread))
			}
			res, err := client.Post(target+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			defer res.Body.Close()
			sc := bufio.NewScanner(res.Body)
			var mine []time.Duration
			first := true
			for sc.Scan() {
				line := sc.Bytes()
				i := bytes.Index(line, []byte(`"sent":`))
				if i < 0 {
					continue
				}
				sent, err := strconv.ParseInt(string(bytes.TrimRight(line[i+7:], "}")), 10, 64)
				if err != nil {
					b.Error(err)
					return
				}
				lat := time.Since(time.Unix(0, sent))
				if first {
					// The first event also carries connection setup and
					// routing, measured by BenchmarkRoundTrip.
					first = false
					continue
				}
				mine = append(mine, lat)
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return lats
}

func quantile(ds []time.Duration, q float64) time.Duration {
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

// BenchmarkConcurrentStreams holds 500 streams of 50 events (one every
// 20 ms: 25,000 events/s in all) open, directly to a backend and through the
// proxy (and, for reference, through the standard library's
// httputil.ReverseProxy), in the same run, and reports the delivery latency of the events
// after each stream's first (the first also pays for connection setup and
// routing) at p50 and p99: the proxy's added latency is the difference.
// Client, proxy and backend share the machine's cores, so the proxy's CPU
// time shows up as latency. Streams start spread over one gap ("spread"),
// as streams from many backends are, or all at once ("burst"), as the
// tokens of one engine step are.
func BenchmarkConcurrentStreams(b *testing.B) {
	streams, gap := 500, 20*time.Millisecond
	if s := os.Getenv("KVROUTE_BENCH_STREAMS"); s != "" {
		streams, _ = strconv.Atoi(s)
	}
	for _, mode := range []string{"spread", "burst"} {
		b.Run(mode, func(b *testing.B) {
			spread := gap
			if mode == "burst" {
				spread = 0
			}
			benchConcurrentStreams(b, streams, gap, spread)
		})
	}
}

func benchConcurrentStreams(b *testing.B, streams int, gap, spread time.Duration) {
	be := stampedBackend(50, gap, nil, nil)
	defer be.Close()
	_, px := newBenchProxy(b, be.URL)
	defer px.Close()
	// The standard library's reverse proxy, flushing every write, as a
	// reference for what any Go proxy pays on this machine.
	u, err := url.Parse(be.URL)
	if err != nil {
		b.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	rp.Transport = upstream.NewTransport()
	ref := httptest.NewServer(rp)
	defer ref.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams}}
	defer client.CloseIdleConnections()
	var direct, proxied, stdlib []time.Duration
	for b.Loop() {
		direct = append(direct, openStreams(b, client, be.URL, streams, spread)...)
		proxied = append(proxied, openStreams(b, client, px.URL, streams, spread)...)
		stdlib = append(stdlib, openStreams(b, client, ref.URL, streams, spread)...)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(quantile(direct, 0.5)), "direct-p50-ms")
	b.ReportMetric(ms(quantile(direct, 0.99)), "direct-p99-ms")
	b.ReportMetric(ms(quantile(proxied, 0.5)), "proxy-p50-ms")
	b.ReportMetric(ms(quantile(proxied, 0.99)), "proxy-p99-ms")
	b.ReportMetric(ms(quantile(stdlib, 0.5)), "stdlib-p50-ms")
	b.ReportMetric(ms(quantile(stdlib, 0.99)), "stdlib-p99-ms")
	b.ReportMetric(ms(quantile(proxied, 0.99)-quantile(direct, 0.99)), "added-p99-ms")
}

// BenchmarkOpenStreamMemory holds 500 streams open, directly and through
// the proxy, and reports the heap and stack in use per stream; the
// difference is what the proxy spends on one open stream.
func BenchmarkOpenStreamMemory(b *testing.B) {
	const streams = 500
	measure := func(b *testing.B, through bool) float64 {
		var hold sync.WaitGroup
		release := make(chan struct{})
		be := stampedBackend(3, 0, &hold, release)
		defer be.Close()
		target := be.URL
		if through {
			_, px := newBenchProxy(b, be.URL)
			defer px.Close()
			target = px.URL
		}
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams}}
		defer client.CloseIdleConnections()
		inUse := func() uint64 {
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			return m.HeapInuse + m.StackInuse
		}
		before := int64(inUse())
		hold.Add(streams)
		done := make(chan struct{})
		go func() {
			openStreams(b, client, target, streams, 0)
			close(done)
		}()
		hold.Wait() // every stream is open and has sent all but its last event
		during := int64(inUse())
		close(release)
		<-done
		return float64(during-before) / streams
	}
	var direct, proxied float64
	for b.Loop() {
		direct = measure(b, false)
		proxied = measure(b, true)
	}
	b.ReportMetric(direct/1024, "direct-KiB/stream")
	b.ReportMetric(proxied/1024, "proxy-KiB/stream")
	b.ReportMetric((proxied-direct)/1024, "added-KiB/stream")
}
