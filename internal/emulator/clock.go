package emulator

import "time"

// Clock is the wall clock the emulator's driver paces itself by. Tests inject
// a fake one so that model time does not depend on how fast the machine is.
// Implementations must be safe for concurrent use.
type Clock interface {
	// Now returns the current wall time.
	Now() time.Time
	// After returns a channel that receives the time once d has elapsed.
	After(d time.Duration) <-chan time.Time
}

// realClock is the system clock.
type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
