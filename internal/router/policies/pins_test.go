package policies

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/routertest"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRouteFollowsResponses routes a conversation of responses through
// every policy: the response a backend produced is continued there, with
// the reason "response", whatever the policy would have chosen.
func TestRouteFollowsResponses(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			bs := routertest.Backends(4)
			r, err := New(name, bs, Options{Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			prev, home := "", (*router.Ticket)(nil)
			for turn := range 8 {
				req := &router.Request{Model: "m", Prompt: strings.Repeat(fmt.Sprintf("turn %d ", turn), 50), PreviousResponseID: prev}
				tk, err := r.Route(req, bs)
				if err != nil {
					t.Fatal(err)
				}
				if home != nil && (tk.Backend != home.Backend || tk.Reason != router.ReasonResponse) {
					t.Fatalf("turn %d: %s (%s), want %s (response)", turn, tk.Backend.Name, tk.Reason, home.Backend.Name)
				}
				prev = fmt.Sprintf("resp_%d", turn)
				o := router.Failed(200)
				o.ResponseID = prev
				tk.Finish(o)
				if home == nil {
					home = tk
				}
			}
			// A failed response teaches nothing.
			tk, _ := r.Route(&router.Request{Model: "m", Prompt: "x"}, bs)
			tk.Finish(router.Outcome{Status: 500, ResponseID: "resp_failed"})
			if r.ResponseBackend("resp_failed", bs) != nil {
				t.Error("a failed response was pinned")
			}
			if got := r.PinStats().Learned; got != 8 {
				t.Errorf("learned %d, want 8", got)
			}
			if n := testutil.CollectAndCount(r.Collector(), "kvroute_response_pins_total", "kvroute_response_pin_entries", "kvroute_response_pins_learned_total"); n != 6 {
				t.Errorf("%d series, want 6 (4 results, entries, learned)", n)
			}
		})
	}
}
