package proxy

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// bucket is a token bucket that refills perMinute tokens a minute, evenly,
// and holds at most perMinute: a key idle for a minute may spend a whole
// minute's allowance at once, never more. It is safe for concurrent use.
type bucket struct {
	mu       sync.Mutex
	capacity float64
	perSec   float64
	level    float64
	at       time.Time // when level was last brought up to date; zero: full
}

func newBucket(perMinute int) *bucket {
	return &bucket{capacity: float64(perMinute), perSec: float64(perMinute) / 60, level: float64(perMinute)}
}

// take removes n tokens at now if the bucket holds them. If not, it takes
// nothing and returns how long until it would hold them; a request larger
// than the capacity can never pass and gets wait < 0.
func (b *bucket) take(now time.Time, n int) (ok bool, wait time.Duration) {
	need := float64(n)
	if need > b.capacity {
		return false, -1
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.at.IsZero() {
		if dt := now.Sub(b.at).Seconds(); dt > 0 { // a clock that steps back refills nothing
			b.level = math.Min(b.capacity, b.level+dt*b.perSec)
		}
	}
	if b.at.IsZero() || now.After(b.at) {
		b.at = now
	}
	if b.level >= need {
		b.level -= need
		return true, 0
	}
	return false, time.Duration((need - b.level) / b.perSec * float64(time.Second))
}

// rateLimited is OpenAI's 429 for a key over its limit of kind
// ("requests" or "tokens"), with Retry-After in whole seconds when waiting
// helps.
func rateLimited(w http.ResponseWriter, name, kind string, limit, asked int, wait time.Duration) *apiError {
	unit := map[string]string{typeRequests: "requests per min (RPM)", typeTokens: "tokens per min (TPM)"}[kind]
	msg := fmt.Sprintf("Rate limit reached for key %s on %s: Limit %d, Requested %d.", name, unit, limit, asked)
	if wait < 0 {
		msg = fmt.Sprintf("Request too large for key %s on %s: Limit %d, Requested %d.", name, unit, limit, asked)
	} else {
		secs := max(1, int(math.Ceil(wait.Seconds())))
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		msg += fmt.Sprintf(" Please try again in %ds.", secs)
	}
	return &apiError{Status: http.StatusTooManyRequests, Message: msg, Type: kind, Code: codeRateLimited}
}
