//go:build race

package sim

// liveTimeScale is the live bench's wall seconds per model second in the
// fidelity test. The race detector slows the proxy, the client and the
// emulators' drivers several times over; at half speed their lag would
// show up as model time.
const liveTimeScale = 1
