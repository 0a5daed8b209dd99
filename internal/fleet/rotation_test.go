package fleet

import (
	"testing"
	"time"
)

func TestRotation(t *testing.T) {
	clock := newFakeClock()
	f, bs, _ := newOutlierFleet(t, 4, Options{}, clock)
	start := clock.Now()
	report(f, bs[1], repeat(gatewayErr, DefaultConsecutiveGatewayErrors)...)
	f.Backoff(bs[2], start.Add(10*time.Second))
	bs[3].SetHealthy(false)
	tests := []struct {
		name string
		b    *Backend
		want Rotation
	}{
		{"in rotation", bs[0], Rotation{Healthy: true}},
		{"ejected", bs[1], Rotation{Healthy: true, Ejected: true, EjectedUntil: start.Add(DefaultBaseEjectionTime), Ejections: 1}},
		{"backing off", bs[2], Rotation{Healthy: true, BackoffUntil: start.Add(10 * time.Second)}},
		{"down", bs[3], Rotation{}},
		{"not in the fleet", NewBackend(9, "x", bs[0].URL), Rotation{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := f.Rotation(tt.b)
			if want := tt.b == bs[0]; got.InRotation() != want {
				t.Errorf("InRotation = %v, want %v", got.InRotation(), want)
			}
			if !got.EjectedUntil.Equal(tt.want.EjectedUntil) || !got.BackoffUntil.Equal(tt.want.BackoffUntil) {
				t.Fatalf("Rotation = %+v, want %+v", got, tt.want)
			}
			got.EjectedUntil, got.BackoffUntil, tt.want.EjectedUntil, tt.want.BackoffUntil = time.Time{}, time.Time{}, time.Time{}, time.Time{}
			if got != tt.want {
				t.Fatalf("Rotation = %+v, want %+v", got, tt.want)
			}
		})
	}
	clock.Advance(11 * time.Second)
	if r := f.Rotation(bs[2]); !r.BackoffUntil.IsZero() {
		t.Errorf("after the backoff: %+v, want no backoff", r)
	}
}
