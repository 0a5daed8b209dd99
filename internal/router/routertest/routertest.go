// Package routertest holds the fixtures the policies' tests share: a fleet of
// backends, deterministic prompt text, and load held on a backend.
package routertest

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// Backends returns n backends named b0..b(n-1), each serving model m with a
// KV cache of 400,000 tokens (25,000 blocks of 16).
func Backends(n int) []*fleet.Backend {
	bs := make([]*fleet.Backend, n)
	for i := range bs {
		u, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", 8001+i))
		bs[i] = fleet.NewBackend(i, fmt.Sprintf("b%d", i), u)
		bs[i].SetInfo(&fleet.Info{Models: []string{"m"}, BlockSize: 16, KVBlocks: 25_000})
	}
	return bs
}

// Words returns n bytes of deterministic text for seed.
func Words(seed, n int) string {
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "w%d_%d ", seed, i)
	}
	return sb.String()[:n]
}

// Pick asks p to pick for req among cands and fails the test on an error.
func Pick(t *testing.T, p router.Policy, req *router.Request, cands []*fleet.Backend) router.Decision {
	t.Helper()
	d, err := p.Pick(req, cands)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Route routes req with r and returns its ticket, failing the test on an
// error.
func Route(t *testing.T, r *router.Router, req *router.Request, cands []*fleet.Backend) *router.Ticket {
	t.Helper()
	tk, err := r.Route(req, cands)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// Hold puts n requests in flight on b, each with prefill tokens queued and
// context tokens of KV; decoding ones are past their first token.
func Hold(b *fleet.Backend, n, prefill, context int, decoding bool) []*fleet.Flight {
	fs := make([]*fleet.Flight, n)
	for i := range fs {
		fs[i] = b.Start(prefill, context)
		if decoding {
			fs[i].FirstToken()
		}
	}
	return fs
}

// Release ends the flights Hold started.
func Release(fs ...[]*fleet.Flight) {
	for _, f := range fs {
		for _, x := range f {
			x.Done()
		}
	}
}
