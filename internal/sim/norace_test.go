//go:build !race

package sim

// liveTimeScale is the live bench's wall seconds per model second in the
// fidelity test.
const liveTimeScale = 0.5
