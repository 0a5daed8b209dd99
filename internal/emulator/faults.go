package emulator

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
)

// Faults are the failures a Server injects, so that a router's hardening
// can be rehearsed against real sockets. The zero value injects none. The
// JSON form is what GET and PUT /admin/faults exchange.
//
// Hang, HangAfterFirst, the rates and DieAfterTokens apply to
// POST /v1/chat/completions, /v1/completions, /v1/responses and
// /v1/messages, and are read once when a
// request arrives: changing them does not release a request already hung.
// Slow applies to the engine, so to every request in flight, from its next
// step on. HealthFail applies to GET /health.
type Faults struct {
	// Hang makes requests wait forever before the response headers: the
	// connection stays open, nothing is answered, /health stays 200.
	Hang bool `json:"hang"`
	// HangAfterFirst sends the first content token (a stream's first
	// content chunk; a non-streaming response waits for it) and then stalls
	// forever with the connection open.
	HangAfterFirst bool `json:"hang_after_first"`
	// Rate500 is the fraction of requests, 0 to 1, answered at once with a
	// 500 server_error.
	Rate500 float64 `json:"rate_500"`
	// Rate429 is the fraction of requests, 0 to 1, answered at once with a
	// 429 and a Retry-After header. Rate500 + Rate429 must not exceed 1.
	Rate429 float64 `json:"rate_429"`
	// RetryAfter is the Retry-After of the 429s, in whole seconds.
	RetryAfter int `json:"retry_after_seconds"`
	// DieAfterTokens, if positive, cuts every response after that many
	// content tokens as a crashed server would: the connection is closed
	// with no terminating chunk (or, not streaming, with no response at
	// all). A reply with fewer tokens completes normally.
	DieAfterTokens int `json:"die_after_tokens"`
	// Slow multiplies the modelled duration of every engine step, so time
	// to first token and the time between tokens, both grow by that factor.
	// 0 and 1 mean no slowdown; the reported model-time latencies include it.
	Slow float64 `json:"slow_factor"`
	// HealthFail makes GET /health answer 503.
	HealthFail bool `json:"health_fail"`
}

// Validate reports whether f's values are in range.
func (f Faults) Validate() error {
	rate := func(name string, v float64) error {
		if !(v >= 0 && v <= 1) {
			return fmt.Errorf("emulator: fault %s %v is not in [0, 1]", name, v)
		}
		return nil
	}
	switch {
	case rate("rate_500", f.Rate500) != nil:
		return rate("rate_500", f.Rate500)
	case rate("rate_429", f.Rate429) != nil:
		return rate("rate_429", f.Rate429)
	case f.Rate500+f.Rate429 > 1:
		return fmt.Errorf("emulator: fault rates rate_500 %v + rate_429 %v exceed 1", f.Rate500, f.Rate429)
	case f.RetryAfter < 0:
		return fmt.Errorf("emulator: fault retry_after_seconds %d is negative", f.RetryAfter)
	case f.DieAfterTokens < 0:
		return fmt.Errorf("emulator: fault die_after_tokens %d is negative", f.DieAfterTokens)
	case f.Slow < 0 || math.IsNaN(f.Slow) || math.IsInf(f.Slow, 0):
		return fmt.Errorf("emulator: fault slow_factor %v must be a positive factor (0: none)", f.Slow)
	}
	return nil
}

// Faults returns the faults in force. Safe for concurrent use.
func (s *Server) Faults() Faults { return *s.faults.Load() }

// SetFaults replaces the faults in force, after validating them. Safe for
// concurrent use.
func (s *Server) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	old := s.faults.Swap(&f)
	if *old != f {
		s.log.Info("faults set", "faults", f)
	}
	return nil
}

// Fault names, the label values of kvroute_emulator_faults_total.
const (
	faultHang           = "hang"
	faultHangAfterFirst = "hang_after_first"
	fault500            = "500"
	fault429            = "429"
	faultDie            = "die"
	faultHealth         = "health_fail"
	faultUnauthorized   = "unauthorized"
)

var faultNames = []string{faultHang, faultHangAfterFirst, fault500, fault429, faultDie, faultHealth, faultUnauthorized}

// injected counts one injected fault.
func (s *Server) injected(name string) { s.metrics.faults.WithLabelValues(name).Inc() }

// drawError decides, from the seeded source, whether the request gets a 500
// or a 429 rather than an answer; nil means neither.
func (s *Server) drawError(f *Faults) *openai.Error {
	if f.Rate500+f.Rate429 <= 0 {
		return nil
	}
	s.faultMu.Lock()
	u := s.faultRand.Float64()
	s.faultMu.Unlock()
	switch {
	case u < f.Rate500:
		s.injected(fault500)
		return &openai.Error{Status: http.StatusInternalServerError,
			Message: "The server had an error while processing your request (injected fault).",
			Type:    openai.TypeServer, Code: "internal_error"}
	case u < f.Rate500+f.Rate429:
		s.injected(fault429)
		return &openai.Error{Status: http.StatusTooManyRequests,
			Message: "Rate limit reached for requests (injected fault).",
			Type:    openai.TypeRequests, Code: "rate_limit_exceeded"}
	}
	return nil
}

// beforeHeaders applies the faults that strike before a response starts. It
// reports whether the request was answered (or hung until it ended) and the
// handler must return.
func (s *Server) beforeHeaders(w http.ResponseWriter, r *http.Request, f *Faults) bool {
	if e := s.drawError(f); e != nil {
		if e.Status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", strconv.Itoa(f.RetryAfter))
		}
		writeError(w, e)
		return true
	}
	if f.Hang {
		s.injected(faultHang)
		// net/http notices a client hanging up only once the body is read.
		_, _ = io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, maxBodyBytes))
		if s.hang(r.Context()) {
			writeError(w, unavailable())
		}
		return true
	}
	return false
}

// hang blocks until the request ends or the server stops; it reports
// whether the server stopped.
func (s *Server) hang(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case <-s.stopped:
		return true
	}
}

// cutAfter returns the number of content tokens after which f cuts a
// response of pieces tokens, 0 for none, and whether the cut hangs (rather
// than dies).
func cutAfter(f *Faults, pieces int) (n int, hang bool) {
	switch {
	case f.DieAfterTokens > 0 && (f.DieAfterTokens <= 1 || !f.HangAfterFirst):
		n = f.DieAfterTokens
	case f.HangAfterFirst:
		n, hang = 1, true
	}
	if n > pieces {
		return 0, false
	}
	return n, hang
}

// die ends the response as a crashed server would: the connection is
// closed without a terminating chunk. net/http recovers this panic
// silently.
func (s *Server) die() {
	s.injected(faultDie)
	panic(http.ErrAbortHandler)
}

// authorized reports whether r carries the API key, compared in constant
// time, as vLLM's AuthenticationMiddleware does.
func (s *Server) authorized(r *http.Request) bool {
	scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "bearer") {
		return false
	}
	sum := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(sum[:], s.apiKeyHash[:]) == 1
}

// needsKey reports whether path is guarded by the API key: vLLM guards
// /v1 and everything under it and leaves /health and /metrics open.
func needsKey(path string) bool { return path == "/v1" || strings.HasPrefix(path, "/v1/") }

func unauthorized() *openai.Error {
	return &openai.Error{Status: http.StatusUnauthorized,
		Message: "Incorrect API key provided: send it as Authorization: Bearer <key>.",
		Type:    openai.TypeInvalidRequest, Code: "invalid_api_key"}
}

// maxAdminBody bounds a PUT /admin/faults body.
const maxAdminBody = 1 << 16

// handleAdminFaults serves GET and PUT /admin/faults to loopback clients.
func (s *Server) handleAdminFaults(w http.ResponseWriter, r *http.Request) {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err != nil || !ap.Addr().Unmap().IsLoopback() {
		writeError(w, &openai.Error{Status: http.StatusForbidden,
			Message: "/admin/faults answers loopback clients only",
			Type:    openai.TypeInvalidRequest, Code: "forbidden"})
		return
	}
	if !allow(w, r, http.MethodGet, http.MethodPut) {
		return
	}
	if r.Method == http.MethodPut {
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody))
		dec.DisallowUnknownFields()
		var f Faults
		if err := dec.Decode(&f); err != nil {
			writeError(w, badRequest("", "faults: %v", err))
			return
		}
		if err := s.SetFaults(f); err != nil {
			writeError(w, badRequest("", "%s", strings.TrimPrefix(err.Error(), "emulator: ")))
			return
		}
	}
	writeJSON(w, http.StatusOK, s.Faults())
}

// slowed stretches a step that ran from start to end by the Slow factor.
func (s *Server) slowed(start, end time.Duration) time.Duration {
	k := s.faults.Load().Slow
	if k == 0 || k == 1 {
		return end
	}
	return start + time.Duration(float64(end-start)*k)
}
