package fleet

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

func TestExpandRanks(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:8000")
	b := NewBackend(3, "gpu0", u)
	b.APIKey = "k"
	bs, err := ExpandRanks(b, 4)
	if err != nil || len(bs) != 4 {
		t.Fatalf("ExpandRanks = %d backends, %v", len(bs), err)
	}
	for r, rb := range bs {
		if rb.Index != 3+r || rb.Name != "gpu0/dp"+string(rune('0'+r)) || rb.Rank != r || rb.Ranks != 4 || rb.URL != u || rb.APIKey != "k" {
			t.Errorf("rank %d: %+v", r, rb)
		}
		h := http.Header{}
		rb.Authorize(h)
		if got := h.Get(HeaderDataParallelRank); got != string(rune('0'+r)) {
			t.Errorf("rank %d sends %s %q", r, HeaderDataParallelRank, got)
		}
	}
	if one, _ := ExpandRanks(b, 1); len(one) != 1 || one[0] != b {
		t.Error("one rank is not the backend itself")
	}
	h := http.Header{}
	b.Authorize(h)
	if h.Get(HeaderDataParallelRank) != "" {
		t.Error("a backend that is no rank sends a rank")
	}
	if _, err := ExpandRanks(b, -1); err == nil {
		t.Error("negative ranks accepted")
	}
}

func TestConfigDPRanks(t *testing.T) {
	cfg, err := ParseConfig([]byte("backends:\n  - {name: a, url: http://127.0.0.1:8000, dp_ranks: 2}\n  - {name: b, url: http://127.0.0.1:8001}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for i, b := range cfg.Backends {
		names = append(names, b.Name)
		if b.Index != i {
			t.Errorf("%s has index %d, want %d", b.Name, b.Index, i)
		}
	}
	if got := strings.Join(names, " "); got != "a/dp0 a/dp1 b" {
		t.Errorf("backends %s, want a/dp0 a/dp1 b", got)
	}
}

// Each rank reads its own engine's series of a data-parallel server's
// metrics, and the fleet keeps every rank though they share a URL.
func TestRanksScrapeTheirEngine(t *testing.T) {
	fb := newFakeBackend(t, `{"data":[{"id":"m"}]}`, vllmDPMetrics)
	f, bs, _ := newTestFleet(t, Options{}, fb)
	ranks, err := ExpandRanks(bs[0], 2)
	if err != nil {
		t.Fatal(err)
	}
	added, _ := f.Update(t.Context(), ranks)
	if len(added) != 2 {
		t.Fatalf("Update added %d ranks, want 2", len(added))
	}
	f.Refresh(t.Context())
	for r, want := range []struct{ running, waiting, kv float64 }{{5, 1, 0.5}, {7, 0, 0.7}} {
		m := ranks[r].metrics.Load()
		if m == nil {
			t.Fatalf("rank %d: no metrics", r)
		}
		if m.Running != want.running || m.Waiting != want.waiting || m.KVUsage != want.kv {
			t.Errorf("rank %d: running %v waiting %v kv %v, want %+v", r, m.Running, m.Waiting, m.KVUsage, want)
		}
	}
}

// A backend that is no rank but serves several engines is told of, once.
func TestEnginesNoted(t *testing.T) {
	fb := newFakeBackend(t, `{"data":[{"id":"m"}]}`, vllmDPMetrics)
	f, _, logs := newTestFleet(t, Options{}, fb)
	const msg = "backend serves several data-parallel engines; route to each with --dp-ranks (dp_ranks in --config)"
	f.Refresh(t.Context())
	f.Refresh(t.Context())
	if n := logs.count(msg); n != 1 {
		t.Errorf("warned %d times, want once", n)
	}
	if !strings.Contains(logs.String(), "--dp-ranks b0=2") {
		t.Errorf("the warning does not give the flag: %s", logs.String())
	}
}
