package router

import (
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
)

func TestPrefixHashesKeyedByAdapter(t *testing.T) {
	prompt := strings.Repeat("the same words ", 100)
	hash := func(adapter, p string) []uint64 {
		r := &Request{Prompt: p, Adapter: adapter}
		return r.PrefixHashes(nil, 64)
	}
	base, a, b := hash("", prompt), hash("a", prompt), hash("b", prompt)
	if len(base) == 0 || len(a) != len(base) || len(b) != len(base) {
		t.Fatalf("block counts %d, %d, %d", len(base), len(a), len(b))
	}
	for i := range base {
		if base[i] == a[i] || a[i] == b[i] || base[i] == b[i] {
			t.Fatalf("block %d shared between adapters", i)
		}
	}
	longer := hash("a", prompt+strings.Repeat("more words ", 50))
	if !slices.Equal(longer[:len(a)], a) {
		t.Error("a longer prompt under the same adapter does not share its prefix's hashes")
	}
}

func TestRouteSetsAdapter(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:1")
	b := fleet.NewBackend(0, "b0", u)
	b.SetInfo(&fleet.Info{Models: []string{"base", "sql"}, Adapters: []string{"sql"}})
	for _, tc := range []struct{ model, want string }{{"sql", "sql"}, {"base", ""}} {
		req := &Request{Model: tc.model}
		setAdapter(req, []*fleet.Backend{b})
		if req.Adapter != tc.want {
			t.Errorf("model %q: Adapter = %q, want %q", tc.model, req.Adapter, tc.want)
		}
	}
}
