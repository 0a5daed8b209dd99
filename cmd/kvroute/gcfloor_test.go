package main

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testfleet"
)

// TestServeGCFloor runs serve as its own process, as the floor is the
// process's: by default at GOGC's 100, with a floor of 128 MiB its small
// heap runs at a GOGC far above 100, with a smaller floor lower.
func TestServeGCFloor(t *testing.T) {
	run, port := processes(t)
	backend := "http://" + testfleet.DeadAddr(t)
	gogc := func(args ...string) float64 {
		t.Helper()
		api, metrics := port(), port()
		run(append([]string{"serve", "--listen", api, "--metrics-listen", metrics, "--backend", backend, "--log-level", "error"}, args...)...)
		base := "http://" + metrics
		deadline := time.Now().Add(30 * time.Second)
		for {
			// Not answering yet is an error to wait out, not a failure.
			if mfs, _ := readMetrics(base); mfs["go_gc_gogc_percent"] != nil {
				return mfs["go_gc_gogc_percent"].GetMetric()[0].GetGauge().GetValue()
			}
			if time.Now().After(deadline) {
				t.Fatalf("serve %v: no go_gc_gogc_percent at %s", args, base)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if g := gogc(); g != 100 {
		t.Errorf("default (no floor): GOGC %v, want 100", g)
	}
	if g := gogc("--gc-floor-mib", "128"); g < 1000 {
		t.Errorf("--gc-floor-mib 128: GOGC %v, want the floor over a live heap of a few MiB, over 1000", g)
	}
	if g := gogc("--gc-floor-mib", "32"); g < 200 || g > 1000 {
		t.Errorf("--gc-floor-mib 32: GOGC %v, want about 32 MiB over a live heap of a few MiB", g)
	}
}
