package fleet

import "time"

// Rotation is a backend's place in the rotation at one moment, as an
// operator's view shows it (the fleet page). The hot path asks inRotation
// instead: this takes the backend's outlier lock to read the ejection's end.
type Rotation struct {
	// Healthy is the health checks' verdict.
	Healthy bool
	// Ejected is set while outlier detection keeps the backend out;
	// EjectedUntil is when the ejection may end (the first health check
	// that passes after it readmits the backend), zero when not ejected.
	Ejected      bool
	EjectedUntil time.Time
	// BackoffUntil is when a 429's Retry-After stops keeping the backend
	// out; zero when it is not backing off.
	BackoffUntil time.Time
	// Ejections counts the backend's ejections since it joined the fleet,
	// every reason together.
	Ejections uint64
}

// InRotation reports whether r lets the backend take requests: healthy, not
// ejected and not backing off.
func (r Rotation) InRotation() bool { return r.Healthy && !r.Ejected && r.BackoffUntil.IsZero() }

// Rotation returns b's place in the rotation now; the zero Rotation for a
// backend not in the fleet. Safe for concurrent use; not for the hot path.
func (f *Fleet) Rotation(b *Backend) Rotation {
	m := f.member(b)
	if m == nil {
		return Rotation{}
	}
	o := &m.out
	r := Rotation{Healthy: b.Healthy()}
	for i := range o.ejections {
		r.Ejections += o.ejections[i].Load()
	}
	if u := o.backoff.Load(); u != 0 && f.now().UnixNano() < u {
		r.BackoffUntil = time.Unix(0, u)
	}
	o.mu.Lock()
	if o.ejected.Load() {
		r.Ejected, r.EjectedUntil = true, o.until
	}
	o.mu.Unlock()
	return r
}
