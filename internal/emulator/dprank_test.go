package emulator

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func startDataParallel(t *testing.T, n int) (*DataParallel, string) {
	t.Helper()
	d, err := NewDataParallel(Config{Model: testModel, Profile: testProfile(t, nil), Clock: newFakeClock(),
		Logger: slog.New(slog.DiscardHandler)}, n)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	ts := httptest.NewServer(d)
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		ts.Close()
	})
	return d, ts.URL
}

func postRank(t *testing.T, url, rank string, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if rank != "" {
		req.Header.Set(HeaderDataParallelRank, rank)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, sb.String()
}

// A request goes to the rank its header names; each rank has its own
// cache, so a prompt cached on rank 1 is not cached on rank 2.
func TestDataParallelRankHeader(t *testing.T) {
	d, url := startDataParallel(t, 4)
	body := `{"model":"` + testModel + `","prompt":"` + words(300) + `","max_tokens":2}`
	for _, rank := range []string{"1", "1", "2"} {
		if status, data := postRank(t, url, rank, body); status != http.StatusOK {
			t.Fatalf("rank %s: %d %s", rank, status, data)
		}
	}
	want := []int64{0, 2, 1, 0}
	for i := range 4 {
		st := d.Rank(i).Stats()
		if got := st.Finished; got != want[i] {
			t.Errorf("rank %d finished %d requests, want %d", i, got, want[i])
		}
		if i == 2 && st.PrefixHits != 0 {
			t.Errorf("rank 2 found %d tokens cached that only rank 1 computed", st.PrefixHits)
		}
	}
	if d.Rank(1).Stats().PrefixHits == 0 {
		t.Error("rank 1's second request found nothing cached")
	}
	for _, bad := range []string{"4", "-1", "x"} {
		if status, data := postRank(t, url, bad, body); status != http.StatusBadRequest || !strings.Contains(data, HeaderDataParallelRank) {
			t.Errorf("header %q: %d %s, want 400 naming the header", bad, status, data)
		}
	}
	// Without the header: the rank with the fewest requests in flight, the
	// lowest among ties.
	if status, _ := postRank(t, url, "", body); status != http.StatusOK || d.Rank(0).Stats().Finished != 1 {
		t.Errorf("a request without the header: %d, rank 0 finished %d", status, d.Rank(0).Stats().Finished)
	}
}

// Every rank's metrics, labelled engine="RANK" as vLLM labels them.
func TestDataParallelMetrics(t *testing.T) {
	_, url := startDataParallel(t, 2)
	fams := scrape(t, url)
	mf := fams["vllm:num_requests_running"]
	if mf == nil || len(mf.GetMetric()) != 2 {
		t.Fatalf("vllm:num_requests_running: %v", mf)
	}
	engines := map[string]bool{}
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "engine" {
				engines[l.GetValue()] = true
			}
		}
	}
	if !engines["0"] || !engines["1"] {
		t.Errorf("engine labels %v, want 0 and 1", engines)
	}
}
