package kvroute

import (
	"math"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/routertest"
)

// The cost is the sum of its named terms, and a debug log lists them all.
func TestTermsListed(t *testing.T) {
	tm := terms{queued: 1, compute: 2, kvWait: 3, slotWait: 4, adapter: 0.5, miss: 5, stream: 6}
	if got := tm.ttft(); got != 10.5 {
		t.Errorf("ttft = %v, want 10.5", got)
	}
	if got := tm.cost(); got != 21.5 {
		t.Errorf("cost = %v, want 21.5", got)
	}
	var names []string
	for _, a := range tm.LogValue().Group() {
		names = append(names, a.Key)
	}
	if got, want := strings.Join(names, " "), "queued compute kv_wait slot_wait adapter calibration miss stream"; got != want {
		t.Errorf("terms listed %q, want %q", got, want)
	}
	// A decision's scores carry the same terms, by the same names.
	l := tm.list()
	if got := strings.Join(l.Names, " "); got != strings.Join(names, " ") {
		t.Errorf("scores' terms %q, the log's %q", got, strings.Join(names, " "))
	}
	for i, a := range tm.LogValue().Group() {
		if l.Seconds[i] != a.Value.Float64() {
			t.Errorf("score's %s = %v, the log's %v", a.Key, l.Seconds[i], a.Value.Float64())
		}
	}
	if l.Sum() != tm.cost() {
		t.Errorf("the scores' terms sum to %v, the cost is %v", l.Sum(), tm.cost())
	}
}

// Every score of a pick lists its terms, which sum to its cost.
func TestPickScoresListTerms(t *testing.T) {
	bs := routertest.Backends(4)
	p := New(bs, Config{Seed: 1, Now: frozenClock})
	routertest.Pick(t, p, &router.Request{Prompt: routertest.Words(0, 400)}, bs)
	d := routertest.Pick(t, p, &router.Request{Prompt: routertest.Words(0, 400) + routertest.Words(1, 50)}, bs)
	if len(d.Scores) != len(bs) {
		t.Fatalf("%d scores for %d backends", len(d.Scores), len(bs))
	}
	for _, s := range d.Scores {
		if s.Terms.Len() != len(termNames) {
			t.Errorf("%s: terms %+v, want all %d", s.Backend, s.Terms, len(termNames))
		}
		if math.Abs(s.Terms.Sum()-s.Cost) > 1e-9*max(1, s.Cost) {
			t.Errorf("%s: terms sum to %v, cost %v", s.Backend, s.Terms.Sum(), s.Cost)
		}
	}
}
