package admission

import (
	"math"
	"testing"
	"time"
)

func TestDrainRate(t *testing.T) {
	start := time.Unix(0, 0)
	tests := []struct {
		name    string
		perSec  float64
		for_    time.Duration // of steady events from start
		stall   time.Duration // then nothing for this long
		want    float64
		wantTol float64 // relative
	}{
		{name: "settled", perSec: 10, for_: 2 * time.Minute, want: 10, wantTol: 0.02},
		{name: "warming up", perSec: 10, for_: 5 * time.Second, want: 10, wantTol: 0.1},
		{name: "slow", perSec: 0.5, for_: 2 * time.Minute, want: 0.5, wantTol: 0.1},
		{name: "stalled one tau", perSec: 10, for_: 2 * time.Minute, stall: rateTau, want: 10 / math.E, wantTol: 0.05},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := drainRate{start: start}
			if got := d.rate(start); got != 0 {
				t.Fatalf("rate %v before any event, want 0", got)
			}
			step := time.Duration(float64(time.Second) / tt.perSec)
			now := start
			for now.Sub(start) < tt.for_ {
				now = now.Add(step)
				d.observe(now)
			}
			got := d.rate(now.Add(tt.stall))
			if math.Abs(got-tt.want) > tt.wantTol*tt.want {
				t.Errorf("rate %.3f/s, want %.3f/s ± %.0f%%", got, tt.want, 100*tt.wantTol)
			}
		})
	}
}

func TestDrainRateFirstEvent(t *testing.T) {
	// One event right after the start must not read as a burst.
	start := time.Unix(0, 0)
	d := drainRate{start: start}
	d.observe(start.Add(time.Millisecond))
	if got := d.rate(start.Add(time.Millisecond)); got > 1.1 {
		t.Errorf("rate %v/s after one event, want about 1/s at most", got)
	}
}
