package epp

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
)

// TestPrefillerHeader checks the P/D header llm-d's decode sidecar reads:
// a split request goes to a decode endpoint with the prefill endpoint in
// x-prefiller-host-port; a request served whole, or one to an endpoint
// picker that never splits, has any such header the client sent removed;
// a prefill endpoint is never the destination; the prefill leg's count is
// released.
func TestPrefillerHeader(t *testing.T) {
	ctx := t.Context()
	bs := emulators(t, ctx, 3)
	pre := bs[2]
	pre.SetRole(fleet.RolePrefill)
	tests := []struct {
		name      string
		splitter  router.Splitter
		path      string
		wantSplit bool
	}{
		{name: "always", splitter: router.SplitAlways{}, path: "/v1/chat/completions", wantSplit: true},
		{name: "never", splitter: router.SplitNever{}, path: "/v1/chat/completions"},
		{name: "no splitter", path: "/v1/chat/completions"},
		{name: "long prompts only", splitter: router.SplitByLength{MinTokens: 100_000}, path: "/v1/chat/completions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, env := startPicker(t, ctx, bs, "kvroute", Options{Splitter: tt.splitter})
			for i := range 4 {
				body := chatBody(model(bs), []message{{"user", fmt.Sprintf("document %d: %s", i, strings.Repeat("lorem ipsum ", 50))}}, 4)
				res, err := env.do(ctx, tt.path, map[string]string{HeaderPrefiller: "10.6.6.6:8000"}, body)
				if err != nil {
					t.Fatal(err)
				}
				if res.status != http.StatusOK {
					t.Fatalf("status %d: %s", res.status, res.body)
				}
				if slices.Contains(res.list, Address(pre)) {
					t.Errorf("destinations %q include the prefill endpoint", res.list)
				}
				switch {
				case tt.wantSplit && res.prefiller != Address(pre):
					t.Errorf("%s = %q, want %q", HeaderPrefiller, res.prefiller, Address(pre))
				case !tt.wantSplit && (res.prefiller != "" || !slices.Contains(res.removed, HeaderPrefiller)):
					t.Errorf("whole request: %s set to %q, removed %q; want the client's removed", HeaderPrefiller, res.prefiller, res.removed)
				}
			}
			for _, b := range bs {
				if l := b.Load(); l.Requests != 0 {
					t.Errorf("%s: %d requests still counted", b.Name, l.Requests)
				}
			}
		})
	}
}
