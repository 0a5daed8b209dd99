package router

import (
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/calibrate"
	"github.com/kvroute/kvroute/internal/fleet"
)

// accuracy scores the policy's TTFT and inter-token predictions against
// the streams that followed, per backend: every driver (the proxy, the
// endpoint picker, the simulator) finishes its tickets here, so each
// reports the same metrics. Only streams count: a non-streamed response's
// first byte comes with its end.
type accuracy struct {
	ttft, itl *calibrate.Accuracy
	mu        sync.Mutex
	live      map[int]bool // the backend indexes named in the metrics
}

func newAccuracy() *accuracy {
	return &accuracy{
		ttft: calibrate.NewAccuracy("ttft", calibrate.DefaultWarmup),
		itl:  calibrate.NewAccuracy("itl", calibrate.DefaultWarmup),
		live: make(map[int]bool),
	}
}

// record scores the ticket's predictions against its outcome.
func (a *accuracy) record(t *Ticket, o Outcome) {
	if o.Status != 200 || o.Tokens <= 0 || o.TTFT <= 0 {
		return
	}
	if t.PredictedTTFT > 0 {
		p := calibrate.Prediction{Mean: t.PredictedTTFT.Seconds(), Lo: t.PredictedTTFTLow.Seconds(), Hi: t.PredictedTTFTHigh.Seconds()}
		a.ttft.Record(t.Backend.Index, p, o.TTFT.Seconds())
	}
	if itl := ObservedITL(o.TTFT, o.Latency, max(o.CompletionTokens, o.Tokens)); t.PredictedITL > 0 && itl > 0 {
		a.itl.Record(t.Backend.Index, calibrate.Prediction{Mean: t.PredictedITL.Seconds()}, itl.Seconds())
	}
}

// ObservedITL returns a stream's mean time between tokens: its decode, from
// the first token to the end, over the tokens after the first; 0 for a
// stream of fewer than two tokens, which has none.
func ObservedITL(ttft, latency time.Duration, tokens int) time.Duration {
	if tokens < 2 || ttft <= 0 || latency <= ttft {
		return 0
	}
	return (latency - ttft) / time.Duration(tokens-1)
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
			a.itl.SetName(b.Index, b.Name)
		}
	}
	for i := range a.live {
		if !now[i] {
			a.ttft.Reset(i)
			a.itl.Reset(i)
		}
	}
	a.live = now
}

// Accuracy returns the scores of the policy's TTFT predictions so far: per
// backend and fleet-wide, their median absolute percentage error and
// interval coverage past the warm-up (calibrate.DefaultWarmup requests).
func (r *Router) Accuracy() calibrate.AccuracySnapshot { return r.accuracy.ttft.Snapshot() }

// AccuracyITL returns the scores of the policy's inter-token predictions
// so far, as Accuracy does the TTFT's (no interval: Coverage is NaN).
func (r *Router) AccuracyITL() calibrate.AccuracySnapshot { return r.accuracy.itl.Snapshot() }
