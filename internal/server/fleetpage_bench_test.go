//go:build linux

package server

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleetpage"
	"github.com/kvroute/kvroute/internal/testfleet"
)

// BenchmarkFleetPageCost measures what the fleet page costs the front: the
// CPU a `kvroute serve` process spends per request, read from its
// /proc/PID/stat, in three modes paired in one run, round after round in
// turn, on the same emulators:
//
//   - off: --fleet-page=false (no ring of decisions);
//   - closed: the page on, no one looking (a ring write per request);
//   - open: the page on and its JSON polled every second, as an open page
//     polls it.
//
// Each round plays streamed chat requests (16 tokens out, 16 at a time) for
// a few seconds at each mode; the medians over rounds are reported as
// CPU microseconds per request, with the front's throughput and the CPU of
// one poll of /fleet.json on its own. Run:
// go test ./internal/server -run '^$' -bench FleetPageCost -benchtime 1x
func BenchmarkFleetPageCost(b *testing.B) {
	const (
		rounds      = 5
		span        = 4 * time.Second
		concurrency = 16
	)
	emus := testfleet.Start(b, 2, "--seed", "9", "--time-scale", "0.05")
	var backends []string
	for i, e := range emus {
		backends = append(backends, "--backend", fmt.Sprintf("gpu%d=%s", i, e.URL()))
	}
	modes := []struct {
		name  string
		serve *servedFront
		poll  bool
	}{
		{"off", startFront(b, append(backends, "--fleet-page=false")), false},
		{"closed", startFront(b, backends), false},
		{"open", nil, true},
	}
	modes[2].serve = modes[1].serve // the same process, looked at
	perReq := make([][]float64, len(modes))
	requests := 0
	for b.Loop() {
		for r := range rounds {
			for k := range modes {
				i := (k + r) % len(modes) // each mode goes first in some round
				m := modes[i]
				cpu, n := m.serve.play(b, span, concurrency, m.poll)
				perReq[i] = append(perReq[i], cpu.Seconds()*1e6/float64(n))
				requests += n
			}
		}
	}
	for i, m := range modes {
		slices.Sort(perReq[i])
		b.ReportMetric(perReq[i][len(perReq[i])/2], "cpu-us/req-"+m.name)
	}
	b.ReportMetric(float64(requests)/float64(rounds*len(modes))/span.Seconds(), "req/s")
	b.Logf("CPU µs per request by round: off %.1f, closed %.1f, open %.1f", perReq[0], perReq[1], perReq[2])
	// One poll's cost on its own, the fleet idle: what an open page adds
	// each second whatever the traffic.
	f := modes[1].serve
	const polls = 200
	before := processCPU(b, f.cmd.Process.Pid)
	for range polls {
		res, err := http.Get(f.metrics + fleetpage.JSONPath)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	b.ReportMetric((processCPU(b, f.cmd.Process.Pid)-before).Seconds()*1e6/polls, "cpu-us/poll")
}

// servedFront is a `kvroute serve` process.
type servedFront struct {
	cmd          *exec.Cmd
	api, metrics string // http://HOST:PORT
}

// startFront starts `kvroute serve` with args, on free loopback ports, and
// waits until it routes.
func startFront(b *testing.B, args []string) *servedFront {
	b.Helper()
	api, metrics := freeAddr(b), freeAddr(b)
	cmd := exec.Command(testfleet.Binary(b), append([]string{"serve", "--listen", api, "--metrics-listen", metrics,
		"--log-level", "error"}, args...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	f := &servedFront{cmd: cmd, api: "http://" + api, metrics: "http://" + metrics}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if res, err := http.Get(f.api + "/readyz"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return f
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("kvroute serve not ready in 30 s")
		}
	}
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// play sends streamed chat requests, concurrency at a time, for span (and
// polls the fleet page's JSON every second when poll is set), and returns
// the CPU the front spent meanwhile and the requests it answered.
func (f *servedFront) play(b *testing.B, span time.Duration, concurrency int, poll bool) (time.Duration, int) {
	b.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}}
	var (
		done atomic.Int64
		wg   sync.WaitGroup
	)
	stop := time.Now().Add(span)
	before := processCPU(b, f.cmd.Process.Pid)
	for w := range concurrency {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"session %d: %s turn %d"}],"max_tokens":16,"stream":true}`,
					model, w, strings.Repeat("Tell me about the fleet. ", 20), i)
				res, err := client.Post(f.api+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode == http.StatusOK {
					done.Add(1)
				}
			}
		})
	}
	if poll {
		wg.Go(func() {
			for ; time.Now().Before(stop); time.Sleep(time.Second) {
				res, err := client.Get(f.metrics + fleetpage.JSONPath)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		})
	}
	wg.Wait()
	return processCPU(b, f.cmd.Process.Pid) - before, int(done.Load())
}

// processCPU is the user and system CPU time process pid has used, from
// /proc/PID/stat, in clock ticks (USER_HZ, 100 a second on Linux).
func processCPU(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command's name, which is in parentheses and
	// may hold spaces: state is the 3rd field, utime the 14th, stime 15th.
	rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
	fields := strings.Fields(rest)
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
