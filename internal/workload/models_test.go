package workload

import (
	"math"
	"testing"
)

// Sessions get models in proportion to the weights, the same for the same
// seed; bad weights are refused.
func TestAssignModels(t *testing.T) {
	w := Workload{Sessions: make([]Session, 4000)}
	if err := AssignModels(&w, []string{"a", "b", "c"}, []float64{4, 2, 2}, 7); err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, s := range w.Sessions {
		n[s.Model]++
	}
	for m, want := range map[string]float64{"a": 0.5, "b": 0.25, "c": 0.25} {
		if got := float64(n[m]) / 4000; math.Abs(got-want) > 0.03 {
			t.Errorf("model %s: %.3f of the sessions, want %.2f", m, got, want)
		}
	}
	again := Workload{Sessions: make([]Session, 4000)}
	_ = AssignModels(&again, []string{"a", "b", "c"}, []float64{4, 2, 2}, 7)
	for i := range w.Sessions {
		if w.Sessions[i].Model != again.Sessions[i].Model {
			t.Fatalf("session %d: %s, then %s for the same seed", i, w.Sessions[i].Model, again.Sessions[i].Model)
		}
	}
	for _, bad := range [][]float64{{1}, {1, 0}, {1, -1}} {
		if err := AssignModels(&w, []string{"a", "b"}, bad, 1); err == nil {
			t.Errorf("weights %v: no error", bad)
		}
	}
}
