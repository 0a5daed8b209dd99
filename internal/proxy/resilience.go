package proxy

import (
	"sync/atomic"
	"time"
)

// Defaults of Resilience. Each is in docs/operations.md with its reason.
const (
	// DefaultFirstTokenFloor and DefaultFirstTokenFactor make a streamed
	// request's first-token deadline floor + factor × the policy's
	// predicted TTFT: a hung backend is noticed in seconds, a 100k-token
	// prompt predicted to take 10 s gets 55 s.
	DefaultFirstTokenFloor  = 15 * time.Second
	DefaultFirstTokenFactor = 4.0
	// DefaultStreamIdleTimeout ends a stream whose backend sent nothing for
	// this long after its first token (nginx's proxy_read_timeout): decode
	// steps take milliseconds, a preemption seconds.
	DefaultStreamIdleTimeout = 60 * time.Second
	// DefaultResponseTimeout bounds the wait for a non-streamed response's
	// headers, which a backend sends only when the whole generation is done.
	DefaultResponseTimeout = 10 * time.Minute
	// DefaultResponseFloor and DefaultResponseFactor make a non-streamed
	// request's deadline floor + factor × its predicted end-to-end time,
	// the TTFT's deadline with the generation added: a hung backend is
	// noticed as a stream's would be, plus the answer's own time
	// (docs/decisions/0015-non-streamed-deadline.md).
	DefaultResponseFloor  = 15 * time.Second
	DefaultResponseFactor = 4.0
	// DefaultResponseTokenTime is the time per output token the predicted
	// end-to-end time assumes: slow on purpose (20 tokens a second, a small
	// model on CPUs or a batch of hundreds), so that only a hung backend
	// misses it.
	DefaultResponseTokenTime = 50 * time.Millisecond
	// DefaultResponseTokens is the output length assumed for a request
	// that sets no max_tokens.
	DefaultResponseTokens = 1024
	// DefaultMaxAttempts is how many backends one request may try before
	// its first byte reaches the client.
	DefaultMaxAttempts = 3
	// DefaultRetryBudget and DefaultRetryBudgetMin bound the retries pending
	// to half the requests in flight, but at least 3: a fleet that lost one
	// backend in three still places every request, while a fleet failing
	// as a whole sees at most 1.5 times its load. (Envoy's budget is 20 %
	// of active requests; a backend's death fails a third of them at once.)
	DefaultRetryBudget    = 0.5
	DefaultRetryBudgetMin = 3
	// DefaultMaxMigrations is how many times one stream may continue on
	// another backend after its backend failed mid-way: a fleet that loses
	// a backend, then the one that took the stream over, still finishes
	// it; past that the fleet is failing as a whole.
	DefaultMaxMigrations = 2
	// DefaultBodyReadTimeout bounds reading a request's body: 32 MiB at
	// a slow client's 1 MB/s, and no slow-body connection held forever.
	DefaultBodyReadTimeout = 60 * time.Second
)

// Resilience configures the proxy's timeouts and retries. Zero values take
// the defaults; negative durations turn that timeout off.
type Resilience struct {
	// FirstTokenFloor and FirstTokenFactor give a streamed request's
	// deadline for its first token: floor + factor × predicted TTFT.
	FirstTokenFloor  time.Duration
	FirstTokenFactor float64
	// StreamIdleTimeout ends a response whose backend sent nothing for
	// this long after the first token.
	StreamIdleTimeout time.Duration
	// ResponseTimeout bounds the wait for a non-streamed response's first
	// byte, whatever its deadline below.
	ResponseTimeout time.Duration
	// ResponseFloor and ResponseFactor give a non-streamed chat or
	// completion its deadline for the answer's first byte: floor + factor
	// × its predicted end-to-end time, the predicted TTFT plus its output
	// tokens (max_tokens, or DefaultResponseTokens) at ResponseTokenTime
	// each. Past it nothing has reached the client, so it is retried.
	// A negative floor leaves ResponseTimeout alone.
	ResponseFloor     time.Duration
	ResponseFactor    float64
	ResponseTokenTime time.Duration
	// MaxAttempts bounds the backends a request tries.
	MaxAttempts int
	// RetryBudget is the fraction of requests in flight that may be
	// retrying at once; RetryBudgetMin the retries always allowed.
	RetryBudget    float64
	RetryBudgetMin int
	// BodyReadTimeout bounds reading a request body.
	BodyReadTimeout time.Duration
	// MaxMigrations bounds how many times a stream cut after its first
	// bytes continues on another backend (migrate.go); negative: never.
	MaxMigrations int
}

func (r Resilience) withDefaults() Resilience {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&r.FirstTokenFloor, DefaultFirstTokenFloor)
	def(&r.StreamIdleTimeout, DefaultStreamIdleTimeout)
	def(&r.ResponseTimeout, DefaultResponseTimeout)
	def(&r.ResponseFloor, DefaultResponseFloor)
	def(&r.ResponseTokenTime, DefaultResponseTokenTime)
	if r.ResponseFactor == 0 {
		r.ResponseFactor = DefaultResponseFactor
	}
	def(&r.BodyReadTimeout, DefaultBodyReadTimeout)
	if r.FirstTokenFactor == 0 {
		r.FirstTokenFactor = DefaultFirstTokenFactor
	}
	if r.MaxAttempts <= 0 {
		r.MaxAttempts = DefaultMaxAttempts
	}
	if r.RetryBudget == 0 {
		r.RetryBudget = DefaultRetryBudget
	}
	if r.MaxMigrations == 0 {
		r.MaxMigrations = DefaultMaxMigrations
	}
	if r.RetryBudgetMin == 0 {
		r.RetryBudgetMin = DefaultRetryBudgetMin
	}
	return r
}

// retryBudget bounds the retries pending (Envoy's retry budget): a retry
// counts from the failure that caused it until its own attempt answers
// (its first byte reaches the client) or fails. Once answered, a retried
// request loads its backend like any other. The requests in flight it is a
// share of are the most seen in the last budgetMemory: a burst whose
// healthy part has already finished still counts while its hung part
// waits for its retries.
type retryBudget struct {
	active, retrying atomic.Int64
	peak, peakAt     atomic.Int64 // the most requests in flight lately, and since when (Unix ns)
	ratio            float64
	min              int64
	now              func() time.Time
}

// budgetMemory is how long a peak of requests in flight counts.
const budgetMemory = 5 * time.Second

// start counts a request in flight.
func (b *retryBudget) start() {
	n, now := b.active.Add(1), b.now().UnixNano()
	if now-b.peakAt.Load() > int64(budgetMemory) {
		b.peak.Store(n)
		b.peakAt.Store(now)
		return
	}
	for p := b.peak.Load(); n > p && !b.peak.CompareAndSwap(p, n); p = b.peak.Load() {
	}
}

// limit is the retries pending the budget allows now.
func (b *retryBudget) limit() int64 {
	live := b.active.Load()
	if b.now().UnixNano()-b.peakAt.Load() <= int64(budgetMemory) {
		live = max(live, b.peak.Load())
	}
	return max(b.min, int64(b.ratio*float64(live)))
}

// allows reports whether one more retry fits the budget now.
func (b *retryBudget) allows() bool { return b.retrying.Load() < b.limit() }

// acquire takes a retry from the budget, if it allows one.
func (b *retryBudget) acquire() bool {
	for {
		n := b.retrying.Load()
		if n >= b.limit() {
			return false
		}
		if b.retrying.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// retried gives back c's retry to the budget, if it holds one: its attempt
// has answered, or failed.
func (p *Proxy) retried(c *call) {
	if c.retrying {
		c.retrying = false
		p.budget.retrying.Add(-1)
	}
}
