package main

import (
	"flag"
	"time"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/server"
)

// defaultConnectTimeout bounds a connection to a backend: on a LAN a
// backend that has not answered a SYN in 3 s is not there.
const defaultConnectTimeout = 3 * time.Second

// defaultGCFloorMiB is off: a floor makes a front's collections rare, but
// moved neither its latency tail nor its CPU, so the memory is not spent by
// default (docs/decisions/0003-gc-heap-floor-off.md).
const defaultGCFloorMiB = 0

// registerHardening adds the flags of timeouts, retries, outlier ejection,
// overload and drain; docs/operations.md gives each its reason.
func registerHardening(fs *flag.FlagSet, cfg *serveConfig) {
	r, o, s, ej := &cfg.resilience, &cfg.overload, &cfg.server, &cfg.fleet.Outlier
	fs.DurationVar(&cfg.connectTimeout, "connect-timeout", defaultConnectTimeout, "limit of a connection to a backend")
	fs.BoolVar(&cfg.stdlibUpstream, "stdlib-upstream", false, "send requests to plain-http backends through net/http's Transport rather than the proxy's lean HTTP/1.1 path")
	fs.IntVar(&cfg.gcFloorMiB, "gc-floor-mib", defaultGCFloorMiB, "the heap may grow to this many MiB before the garbage collector runs; above it GOGC applies as usual (0: GOGC alone; GOGC=off or GOMEMLIMIT in the environment still rule)")
	fs.BoolVar(&cfg.netConnIO, "netconn-io", false, "read and write client and backend sockets through net.Conn rather than with raw system calls that leave the Go runtime's monitor thread asleep")
	fs.DurationVar(&r.FirstTokenFloor, "first-token-floor", proxy.DefaultFirstTokenFloor, "a stream's first token is due within this plus --first-token-factor × its predicted TTFT; then it is retried elsewhere (negative: no limit)")
	fs.Float64Var(&r.FirstTokenFactor, "first-token-factor", proxy.DefaultFirstTokenFactor, "see --first-token-floor")
	fs.DurationVar(&r.StreamIdleTimeout, "stream-idle-timeout", proxy.DefaultStreamIdleTimeout, "a response whose backend sends nothing this long after the first token ends with an error event (negative: none)")
	fs.DurationVar(&r.ResponseTimeout, "response-timeout", proxy.DefaultResponseTimeout, "limit of a non-streamed response's wait for its answer (negative: none)")
	fs.DurationVar(&r.ResponseFloor, "response-floor", proxy.DefaultResponseFloor, "a non-streamed chat or completion is due within this plus --response-factor × its predicted end-to-end time; then it is retried elsewhere (negative: only --response-timeout)")
	fs.Float64Var(&r.ResponseFactor, "response-factor", proxy.DefaultResponseFactor, "see --response-floor")
	fs.DurationVar(&r.ResponseTokenTime, "response-token-time", proxy.DefaultResponseTokenTime, "time per output token (max_tokens, else 1024) of the predicted end-to-end time behind --response-floor")
	fs.IntVar(&r.MaxAttempts, "max-attempts", proxy.DefaultMaxAttempts, "most backends one request tries before its first byte reaches the client")
	fs.Float64Var(&r.RetryBudget, "retry-budget", proxy.DefaultRetryBudget, "retries in flight at most this fraction of the requests in flight ...")
	fs.IntVar(&r.RetryBudgetMin, "retry-budget-min", proxy.DefaultRetryBudgetMin, "... or this many")
	fs.BoolVar(&cfg.migrate, "migrate", true, "a stream whose backend fails after its first token continues on another backend, asked to continue the text sent so far (false: it ends with an error event)")
	fs.IntVar(&r.MaxMigrations, "max-migrations", proxy.DefaultMaxMigrations, "most times one stream continues on another backend (0: never)")
	fs.DurationVar(&r.BodyReadTimeout, "body-read-timeout", proxy.DefaultBodyReadTimeout, "limit of reading a request body (408 past it; negative: none)")

	fs.DurationVar(&s.ReadHeaderTimeout, "read-header-timeout", server.DefaultReadHeaderTimeout, "limit of reading a request's headers (negative: none)")
	fs.DurationVar(&s.IdleTimeout, "idle-timeout", server.DefaultIdleTimeout, "a kept-alive client connection idle this long is closed (negative: none)")
	fs.IntVar(&s.MaxConns, "max-conns", server.DefaultMaxConns, "most client connections open at once (negative: no cap)")
	fs.DurationVar(&s.DrainDelay, "drain-delay", server.DefaultDrainDelay, "on SIGTERM, /readyz answers 503 this long while requests are still accepted")
	fs.DurationVar(&s.Grace, "shutdown-grace", server.DefaultGrace, "then requests in flight get this long to finish; streams still running end with an error event")

	fs.IntVar(&o.Admission.MaxInFlight, "max-in-flight", admission.DefaultMaxInFlight, "most generation requests in flight over the fleet (negative: no cap)")
	fs.IntVar(&o.MaxPerBackend, "max-per-backend", admission.DefaultMaxPerBackend, "most generation requests in flight on one backend; past it requests wait in the router's queue (negative: no cap)")
	fs.IntVar(&o.Admission.MaxQueue, "max-queue", admission.DefaultMaxQueue, "most requests waiting in the router's queue; past it 429 (negative: no queue)")
	fs.DurationVar(&o.Admission.QueueTimeout, "queue-timeout", admission.DefaultQueueTimeout, "longest wait in the queue; past it 429")
	fs.DurationVar(&o.DefaultDeadline, "default-deadline", 0, "time to first token granted a request without an X-Kvroute-Deadline header; one predicted to miss it gets 429 at once (0: none)")

	fs.IntVar(&ej.ConsecutiveGatewayErrors, "eject-gateway-errors", fleet.DefaultConsecutiveGatewayErrors, "eject a backend after this many connection failures or 502/503/504 in a row (negative: never)")
	fs.IntVar(&ej.Consecutive5xx, "eject-5xx", fleet.DefaultConsecutive5xx, "eject a backend after this many 5xx in a row (negative: never)")
	fs.IntVar(&ej.ConsecutiveTimeouts, "eject-timeouts", fleet.DefaultConsecutiveTimeouts, "eject a backend after this many timeouts in a row (negative: never)")
	fs.IntVar(&ej.ConsecutiveSlow, "eject-slow", fleet.DefaultConsecutiveSlow, "eject a backend after this many first tokens in a row slower than --eject-latency-factor × predicted + --eject-latency-floor (negative: never)")
	fs.Float64Var(&ej.LatencyFactor, "eject-latency-factor", fleet.DefaultLatencyFactor, "see --eject-slow")
	fs.DurationVar(&ej.LatencyFloor, "eject-latency-floor", fleet.DefaultLatencyFloor, "see --eject-slow")
	fs.DurationVar(&ej.BaseEjectionTime, "eject-base-time", fleet.DefaultBaseEjectionTime, "an ejection lasts this times the backend's ejections so far ...")
	fs.DurationVar(&ej.MaxEjectionTime, "eject-max-time", fleet.DefaultMaxEjectionTime, "... up to this; then a passed health check brings it back")
	fs.IntVar(&ej.MaxEjectionPercent, "eject-max-percent", fleet.DefaultMaxEjectionPercent, "never eject more than this percent of the fleet at once (at least one backend)")
}
