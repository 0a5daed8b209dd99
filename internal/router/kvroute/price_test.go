package kvroute

import (
	"strings"
	"testing"
)

// The cost is the sum of its named terms, and a debug log lists them all.
func TestTermsListed(t *testing.T) {
	tm := terms{queued: 1, compute: 2, kvWait: 3, slotWait: 4, miss: 5, stream: 6}
	if got := tm.ttft(); got != 10 {
		t.Errorf("ttft = %v, want 10", got)
	}
	if got := tm.cost(); got != 21 {
		t.Errorf("cost = %v, want 21", got)
	}
	var names []string
	for _, a := range tm.LogValue().Group() {
		names = append(names, a.Key)
	}
	if got, want := strings.Join(names, " "), "queued compute kv_wait slot_wait miss stream"; got != want {
		t.Errorf("terms listed %q, want %q", got, want)
	}
}
