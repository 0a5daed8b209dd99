package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/internal/peers"
)

// TestPeerLag measures, across real processes, how long after a request
// is sent to router replica A replica B counts it among its peers' work:
// two `kvroute serve` replicas that follow each other's pushed counts and
// two that poll them (--peer-push=false), all four in front of the same
// two emulated backends (`kvroute emulate`), the two pairs measured in
// turns. B's view is read from its metrics (kvroute_peer_requests), so the
// figure includes A's handling of the request and one scrape of B. A
// measurement, not a check: it runs only with KVROUTE_PEER_LAG set to the
// number of trials per pair (docs/BENCHMARKS.md, Router replicas).
func TestPeerLag(t *testing.T) {
	trials, _ := strconv.Atoi(os.Getenv("KVROUTE_PEER_LAG"))
	if trials <= 0 {
		t.Skip("a measurement: set KVROUTE_PEER_LAG=N (trials) to run it")
	}
	run, port := processes(t)

	emu := port()
	_, p0, _ := strings.Cut(emu, ":")
	first, _ := strconv.Atoi(p0)
	// Two free ports in a row are not guaranteed; the emulator says if not.
	emulators := run("emulate", "--port", strconv.Itoa(first), "--replicas", "2", "--model", "m")
	backends := []string{"--backend", fmt.Sprintf("gpu0=http://127.0.0.1:%d", first), "--backend", fmt.Sprintf("gpu1=http://127.0.0.1:%d", first+1)}

	type pair struct {
		name                string
		a, aMetric, bMetric string // A's API and metrics, B's metrics
	}
	var pairs []pair
	for _, push := range []bool{true, false} {
		apiA, apiB, metA, metB := port(), port(), port(), port()
		common := append([]string{"serve", "--replicas", "2", "--peer-push=" + strconv.FormatBool(push), "--log-level", "error"}, backends...)
		a := run(append(common, "--listen", apiA, "--metrics-listen", metA, "--peer", "http://"+metB)...)
		b := run(append(common, "--listen", apiB, "--metrics-listen", metB, "--peer", "http://"+metA)...)
		for _, api := range []string{apiA, apiB} {
			if err := waitReady(t, "http://"+api, emulators, a, b); err != nil {
				t.Fatal(err)
			}
		}
		name := "poll"
		if push {
			name = "push"
		}
		pairs = append(pairs, pair{name, "http://" + apiA, "http://" + metA, "http://" + metB})
	}

	rng := rand.New(rand.NewPCG(1, 2))
	lags, afterA := map[string][]time.Duration{}, map[string][]time.Duration{}
	var scrapes []time.Duration
	for range trials {
		for _, p := range pairs {
			// A random phase against B's poll ticks.
			time.Sleep(time.Duration(rng.Int64N(int64(100 * time.Millisecond))))
			ctx, cancel := context.WithCancel(context.Background())
			t0 := time.Now()
			go streamChat(ctx, p.a)
			counted := make(chan time.Time, 1) // when A's own report first shows the request
			go func() { counted <- ownCounted(ctx, p.aMetric) }()
			for {
				began := time.Now()
				n := peerRequests(t, p.bMetric)
				seen := time.Now()
				scrapes = append(scrapes, seen.Sub(began))
				if n >= 1 {
					lags[p.name] = append(lags[p.name], seen.Sub(t0))
					if tA := <-counted; !tA.IsZero() {
						afterA[p.name] = append(afterA[p.name], seen.Sub(tA))
					}
					break
				}
				if seen.Sub(t0) > 10*time.Second {
					t.Fatalf("%s: B never saw A's request", p.name)
				}
			}
			cancel()
			deadline := time.Now().Add(10 * time.Second)
			for peerRequests(t, p.bMetric) != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%s: A's ended request never left B's count", p.name)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	q := func(ds []time.Duration, f float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[min(len(s)-1, int(f*float64(len(s))))]
	}
	for _, p := range pairs {
		ds := lags[p.name]
		t.Logf("%s: %d trials, request sent to A until B counts it: median %v, p90 %v, max %v", p.name, len(ds),
			q(ds, 0.5).Round(10*time.Microsecond), q(ds, 0.9).Round(10*time.Microsecond), q(ds, 1).Round(10*time.Microsecond))
		if ds := afterA[p.name]; len(ds) > 0 {
			t.Logf("%s: %d trials, A's own report shows it until B counts it: median %v, p90 %v, max %v", p.name, len(ds),
				q(ds, 0.5).Round(10*time.Microsecond), q(ds, 0.9).Round(10*time.Microsecond), q(ds, 1).Round(10*time.Microsecond))
		}
	}
	t.Logf("one scrape of B's metrics: median %v", q(scrapes, 0.5).Round(10*time.Microsecond))
	// The pushing B's own measure, from the change on A to its
	// application on B (one clock: one host).
	mfs := scrape(t, pairs[0].bMetric)
	if mf := mfs["kvroute_peer_stream_lag_seconds"]; mf != nil && len(mf.GetMetric()) == 1 {
		h := mf.GetMetric()[0].GetHistogram()
		var median float64
		for _, b := range h.GetBucket() {
			if float64(b.GetCumulativeCount()) >= float64(h.GetSampleCount())/2 {
				median = b.GetUpperBound()
				break
			}
		}
		t.Logf("push, B's kvroute_peer_stream_lag_seconds: %d updates, mean %.3f ms, median at most %.3f ms",
			h.GetSampleCount(), 1000*h.GetSampleSum()/float64(h.GetSampleCount()), 1000*median)
	}
}

// processes builds kvroute and returns run, which starts it with args
// until the test ends, and port, a free 127.0.0.1 address (freeRun's).
func processes(t *testing.T) (run func(args ...string) *process, port func() string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kvroute")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	run = func(args ...string) *process {
		p := &process{cmd: exec.Command(bin, args...), done: make(chan struct{})}
		p.cmd.Stderr = &p.stderr
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { _ = p.cmd.Wait(); close(p.done) }()
		t.Cleanup(func() {
			p.stop()
			if t.Failed() {
				t.Logf("kvroute %s: stderr:\n%s", args[0], &p.stderr)
			}
		})
		return p
	}
	port = func() string { return fmt.Sprintf("127.0.0.1:%d", freeRun(t, 1)) } // below the ephemeral range
	return run, port
}

// process is a kvroute process a test started.
type process struct {
	cmd    *exec.Cmd
	stderr lockedBuffer
	done   chan struct{} // closed once it has exited
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop interrupts the process, if it still runs, and waits until it has
// exited.
func (p *process) stop() {
	if !p.exited() {
		_ = p.cmd.Process.Signal(os.Interrupt)
	}
	<-p.done
}

// portTaken reports whether the process exited because an address it was
// to listen on was in use.
func (p *process) portTaken() bool {
	return p.exited() && strings.Contains(p.stderr.String(), "address already in use")
}

// exitOf returns an error, with its stderr, when one of ps has exited.
func exitOf(ps []*process) error {
	for _, p := range ps {
		if p.exited() {
			return fmt.Errorf("kvroute %s exited: %s", p.cmd.Args[1], &p.stderr)
		}
	}
	return nil
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitReady waits for a replica's /readyz to answer 200, while the
// processes it depends on run; it returns an error, with the first
// one's stderr, once one of them has exited.
func waitReady(t *testing.T, base string, deps ...*process) error {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := exitOf(deps); err != nil {
			return err
		}
		res, err := http.Get(base + "/readyz")
		status := ""
		if err == nil {
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
			status = fmt.Sprintf("%d %s", res.StatusCode, bytes.TrimSpace(body))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready in 30 s: %v%s", base, err, status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// streamChat sends a long streaming request and reads it until ctx ends.
func streamChat(ctx context.Context, base string) {
	body := `{"model":"m","messages":[{"role":"user","content":"count to a thousand"}],"max_tokens":2000,"stream":true}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
	}
}

// peerRequests sums kvroute_peer_requests over the backends in the metrics
// at base.
func peerRequests(t *testing.T, base string) float64 {
	t.Helper()
	var n float64
	if mf := scrape(t, base)["kvroute_peer_requests"]; mf != nil {
		for _, m := range mf.GetMetric() {
			n += m.GetGauge().GetValue()
		}
	}
	return n
}

// scrape reads the metrics at base.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := readMetrics(base)
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// readMetrics reads and parses the metrics at base.
func readMetrics(base string) (map[string]*dto.MetricFamily, error) {
	res, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(res.Body)
}

// ownCounted polls a replica's own report (peers.Path, a few bytes) until
// it shows a request in flight, and returns when; zero if ctx ends first.
func ownCounted(ctx context.Context, base string) time.Time {
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+peers.Path, nil)
		if err != nil {
			return time.Time{}
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			continue
		}
		var r peers.Report
		err = json.NewDecoder(res.Body).Decode(&r)
		res.Body.Close()
		at := time.Now()
		if err != nil {
			continue
		}
		for _, c := range r.Backends {
			if c.Requests > 0 {
				return at
			}
		}
	}
	return time.Time{}
}
