package router

import (
	"sync"

	"github.com/kvroute/kvroute/internal/calibrate"
	"github.com/kvroute/kvroute/internal/fleet"
)

// accuracy scores the policy's TTFT predictions against the first tokens
// that followed, per backend: every driver (the proxy, the endpoint picker,
// the simulator) finishes its tickets here, so each reports the same
// metrics. Only streams count: a non-streamed response's first byte comes
// with its end.
type accuracy struct {
	ttft *calibrate.Accuracy
	mu   sync.Mutex
	live map[int]bool // the backend indexes named in the metrics
}

func newAccuracy() *accuracy {
	return &accuracy{ttft: calibrate.NewAccuracy("ttft", calibrate.DefaultWarmup), live: make(map[int]bool)}
}

// record scores the ticket's prediction against its outcome.
func (a *accuracy) record(t *Ticket, o Outcome) {
	if t.PredictedTTFT <= 0 || o.Status != 200 || o.Tokens <= 0 || o.TTFT <= 0 {
		return
	}
	p := calibrate.Prediction{Mean: t.PredictedTTFT.Seconds(), Lo: t.PredictedTTFTLow.Seconds(), Hi: t.PredictedTTFTHigh.Seconds()}
	a.ttft.Record(t.Backend.Index, p, o.TTFT.Seconds())
}

// setBackends names the fleet's backends in the metrics and forgets the
// scores of those that left.
func (a *accuracy) setBackends(backends []*fleet.Backend) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := make(map[int]bool, len(backends))
	for _, b := range backends {
		now[b.Index] = true
		if !a.live[b.Index] {
			a.ttft.SetName(b.Index, b.Name)
		}
	}
	for i := range a.live {
		if !now[i] {
			a.ttft.Reset(i)
		}
	}
	a.live = now
}

// Accuracy returns the scores of the policy's TTFT predictions so far: per
// backend and fleet-wide, their median absolute percentage error and
// interval coverage past the warm-up (calibrate.DefaultWarmup requests).
func (r *Router) Accuracy() calibrate.AccuracySnapshot { return r.accuracy.ttft.Snapshot() }
