//go:build race

package server

// raceEnabled is set when the race detector instruments the test binary.
const raceEnabled = true
