package admission

import (
	"math"
	"time"
)

// rateTau is the time constant of the drain-rate average. LLM requests last
// seconds to minutes, so the rate at which slots free up changes on that
// scale; 20 s averages hundreds of releases on a busy router and still
// follows a fleet that slows down within a minute.
const rateTau = 20 * time.Second

// drainRate is an exponentially weighted rate of events per second: each
// event adds 1/τ and the sum decays as e^(-t/τ), so a steady rate λ settles
// at λ and a stall lets the estimate fall. Not safe for concurrent use.
type drainRate struct {
	sum   float64   // decayed to last
	last  time.Time // time of the last event
	start time.Time // for the warm-up correction
	seen  bool
}

// observe counts one event at now.
func (d *drainRate) observe(now time.Time) {
	if d.seen {
		d.sum *= decay(now.Sub(d.last))
	}
	d.sum += 1 / rateTau.Seconds()
	d.last = now
	d.seen = true
}

// rate is the events per second at now, 0 before the first event. Over the
// first τ after start the sum has not yet settled, so it is divided by the
// weight it has had time to gather (as Adam corrects its moments), counting
// at least a second so that the first events do not read as a burst.
func (d *drainRate) rate(now time.Time) float64 {
	if !d.seen {
		return 0
	}
	age := max(now.Sub(d.start), time.Second)
	return d.sum * decay(now.Sub(d.last)) / (1 - decay(age))
}

// decay is e^(-dt/τ), 1 for dt ≤ 0.
func decay(dt time.Duration) float64 {
	if dt <= 0 {
		return 1
	}
	return math.Exp(-dt.Seconds() / rateTau.Seconds())
}
