package admission

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
)

// Reasons a request is turned away. Acquire returns them wrapped in a
// *Rejection, so test with errors.Is and read RetryAfter with errors.As (or
// the RetryAfter function).
var (
	// ErrQueueFull: the queue held MaxQueue waiters and none of them was of
	// a lower class than the arrival; or the request was queued and then
	// displaced by a higher-class arrival.
	ErrQueueFull = errors.New("admission queue full")
	// ErrQueueTimeout: the request waited QueueTimeout without being
	// admitted.
	ErrQueueTimeout = errors.New("admission queue timeout")
	// ErrDeadline: the predicted time to first token plus the expected queue
	// wait exceeds the request's deadline, at arrival or while it waited.
	ErrDeadline = errors.New("deadline unmeetable")
)

// Bounds of Rejection.RetryAfter. Under a second invites a retry storm that
// finds the queue as full as before; over a minute is longer than clients
// are willing to wait and longer than the estimate can be trusted.
const (
	MinRetryAfter = time.Second
	MaxRetryAfter = 60 * time.Second
)

// Rejection is the error of a request the controller turned away: it carries
// the reason (Err: ErrQueueFull, ErrQueueTimeout or ErrDeadline), the
// request's class and when the client should try again.
type Rejection struct {
	Err   error
	Class Class
	// RetryAfter is the expected time until the queue has drained past the
	// request's position: (position + 1) / drain rate, clamped to
	// [MinRetryAfter, MaxRetryAfter].
	RetryAfter time.Duration
}

// Error says what was rejected, why and for how long.
func (r *Rejection) Error() string {
	return fmt.Sprintf("admission: %s request rejected: %v (retry after %v)", r.Class, r.Err, r.RetryAfter)
}

// Unwrap returns the reason, so errors.Is(err, ErrQueueFull) works.
func (r *Rejection) Unwrap() error { return r.Err }

// RetryAfterSeconds is RetryAfter in whole seconds, rounded up, at least 1:
// the value of an HTTP Retry-After header.
func (r *Rejection) RetryAfterSeconds() int {
	return max(1, int(math.Ceil(r.RetryAfter.Seconds())))
}

// Error codes of the OpenAI-shaped bodies a Rejection becomes.
const (
	CodeQueueFull          = "queue_full"
	CodeQueueTimeout       = "queue_timeout"
	CodeDeadlineUnmeetable = "deadline_unmeetable"
)

// OpenAI returns the error the client gets: status 429 for every reason
// (the client should back off and retry; OpenAI's SDKs do so on 429), type
// "requests" as OpenAI's own rate-limit errors, and a code that tells the
// reasons apart.
func (r *Rejection) OpenAI() *openai.Error {
	e := &openai.Error{Status: http.StatusTooManyRequests, Type: openai.TypeRequests}
	switch {
	case errors.Is(r.Err, ErrDeadline):
		e.Code = CodeDeadlineUnmeetable
		e.Message = "The request's deadline cannot be met at the current load; retry later or with a longer deadline."
	case errors.Is(r.Err, ErrQueueTimeout):
		e.Code = CodeQueueTimeout
		e.Message = "The server is overloaded: the request waited too long in the queue; retry later."
	default:
		e.Code = CodeQueueFull
		e.Message = "The server is overloaded: the request queue is full; retry later."
	}
	return e
}

// Write answers an HTTP request with r: the Retry-After header and the
// OpenAI-shaped body of OpenAI, as the whole response.
func (r *Rejection) Write(w http.ResponseWriter) {
	w.Header().Set("Retry-After", strconv.Itoa(r.RetryAfterSeconds()))
	r.OpenAI().Write(w)
}

// RetryAfter returns the RetryAfter of the *Rejection in err's chain, and
// whether there is one.
func RetryAfter(err error) (time.Duration, bool) {
	var r *Rejection
	if errors.As(err, &r) {
		return r.RetryAfter, true
	}
	return 0, false
}
