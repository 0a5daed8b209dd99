//go:build !race

package sim

// raceEnabled is set when the race detector instruments the test binary.
const raceEnabled = false
