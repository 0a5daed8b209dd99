package admission

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestMetricsRegistered(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(Config{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{ // series exported before any request
		"kvroute_admission_queue_length":       NumClasses,
		"kvroute_admission_in_flight":          1,
		"kvroute_admission_admitted_total":     NumClasses,
		"kvroute_admission_rejected_total":     NumClasses * int(numReasons),
		"kvroute_admission_queue_wait_seconds": NumClasses,
		"kvroute_admission_drain_rate":         1,
	}
	for _, f := range families {
		if n, ok := want[f.GetName()]; !ok {
			t.Errorf("unexpected metric %s", f.GetName())
		} else if len(f.GetMetric()) != n {
			t.Errorf("%s: %d series, want %d", f.GetName(), len(f.GetMetric()), n)
		}
		delete(want, f.GetName())
	}
	for name := range want {
		t.Errorf("missing metric %s", name)
	}
	if _, err := New(Config{Registerer: reg}); err == nil {
		t.Error("a second Controller on the same registry: no error")
	}
	// Several Controllers share a registry under a label of their own.
	shared := prometheus.NewRegistry()
	for _, pool := range []string{"a", "b"} {
		if _, err := New(Config{Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"pool": pool}, shared)}); err != nil {
			t.Errorf("pool %s: %v", pool, err)
		}
	}
}
