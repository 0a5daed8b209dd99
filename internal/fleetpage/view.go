package fleetpage

import (
	"math"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/router"
)

// View is the page's JSON (/fleet.json): the fleet at one moment. Every
// field is described in docs/operations.md ("The fleet page").
type View struct {
	// Time is when the view was taken.
	Time time.Time `json:"time"`
	// Policy is the routing policy's name.
	Policy string `json:"policy"`
	// WindowSeconds is the span the windowed counts cover: up to a minute,
	// shorter in the first minute after the page was first asked for.
	WindowSeconds float64 `json:"window_seconds"`
	// Backends are the fleet's backends, in fleet order.
	Backends []BackendView `json:"backends"`
	// Admission is the router's queue.
	Admission AdmissionView `json:"admission"`
	// Retries counts the requests sent to another backend after one failed,
	// by reason, in the window; RetriesTotal since the start.
	Retries      map[string]int64 `json:"retries"`
	RetriesTotal map[string]int64 `json:"retries_total"`
	// Migrations counts the cut streams the proxy tried to continue on
	// another backend, by outcome (continued, finished, failed, unsafe,
	// limit, no_backend: kvroute_migrations_total), in the window;
	// MigrationsTotal since the start.
	Migrations      map[string]int64 `json:"migrations"`
	MigrationsTotal map[string]int64 `json:"migrations_total"`
	// Decisions are the most recent routing decisions, newest first.
	Decisions []DecisionView `json:"decisions"`
	// DecisionsSkipped counts the decisions not kept because another was
	// being recorded at the same moment (the page never slows a request).
	DecisionsSkipped uint64 `json:"decisions_skipped"`
}

// BackendView is one backend on the page.
type BackendView struct {
	Name  string `json:"name"`
	URL   string `json:"url"`
	Index int    `json:"index"`
	// State is "up", or why the backend takes no requests: "down" (health
	// checks fail), "ejected" (outlier detection) or "backoff" (a 429's
	// Retry-After), in that order of precedence.
	State   string `json:"state"`
	Healthy bool   `json:"healthy"`
	Ejected bool   `json:"ejected"`
	// EjectedUntil and BackoffUntil are when the ejection or the backoff
	// may end; absent when there is none.
	EjectedUntil *time.Time `json:"ejected_until,omitempty"`
	BackoffUntil *time.Time `json:"backoff_until,omitempty"`
	// Ejections counts the backend's ejections since it joined.
	Ejections uint64   `json:"ejections"`
	Models    []string `json:"models"`
	// InFlight, PrefillTokens, Decoding and DecodeTokens are the router's
	// own counts of the load it sent (fleet.Backend.Load).
	InFlight      int64 `json:"in_flight"`
	PrefillTokens int64 `json:"prefill_tokens"`
	Decoding      int64 `json:"decoding"`
	DecodeTokens  int64 `json:"decode_tokens"`
	// Engine is what the backend's own /metrics said at the last scrape;
	// null when there is no fresh scrape.
	Engine *EngineView `json:"engine"`
	// HitRate is the share of prompt tokens the backend reported cached
	// (usage) in the window; null without any.
	HitRate Num `json:"hit_rate"`
	// PredictedTTFTMs is the TTFT the policy predicted for the backend at
	// its latest decision that scored it; ObservedTTFTMs the mean TTFT of
	// the backend's successful requests in the window. Null when unknown.
	PredictedTTFTMs Num `json:"predicted_ttft_ms"`
	ObservedTTFTMs  Num `json:"observed_ttft_ms"`
	// Accuracy scores the policy's TTFT predictions for the backend.
	Accuracy AccuracyView `json:"accuracy"`
	// Served counts the requests the backend answered in the window, by
	// route reason; ServedTotal is their sum.
	Served      map[string]int64 `json:"served"`
	ServedTotal int64            `json:"served_total"`
}

// EngineView is a backend's scraped metrics.
type EngineView struct {
	// Running and Waiting are the engine's batch and queue lengths.
	Running float64 `json:"running"`
	Waiting float64 `json:"waiting"`
	// KVUsage is the share of the KV cache in use, [0, 1]; null when the
	// engine does not report it.
	KVUsage Num `json:"kv_usage"`
	// HitRate is the engine's prefix-cache hit rate in the window (hit over
	// queried tokens); null when it reports no prefix-cache counters.
	HitRate Num `json:"hit_rate"`
	// AgeSeconds is how old the scrape is.
	AgeSeconds float64 `json:"age_seconds"`
}

// AccuracyView scores the TTFT predictions for one backend, over all time
// since it joined (router.Router.Accuracy).
type AccuracyView struct {
	// Count is the streamed requests whose TTFT was predicted and observed;
	// Scored those past the fleet's warm-up.
	Count  uint64 `json:"count"`
	Scored uint64 `json:"scored"`
	// MedianError is the median absolute percentage error, as a fraction
	// (0.25: 25 %); Coverage the share inside the predicted interval.
	MedianError Num `json:"median_error"`
	Coverage    Num `json:"coverage"`
}

// AdmissionView is the router's admission queue.
type AdmissionView struct {
	// Queued is the requests waiting now; InFlight those admitted and not
	// yet released.
	Queued   int64 `json:"queued"`
	InFlight int64 `json:"in_flight"`
	// Rejected counts the requests turned away in the window by reason
	// (the queue's: queue_full, queue_timeout, deadline, canceled; and
	// deadline_at_once: refused without queueing, the best backend's
	// predicted TTFT past the request's deadline); RejectedTotal since the
	// start.
	Rejected      map[string]int64 `json:"rejected"`
	RejectedTotal map[string]int64 `json:"rejected_total"`
}

// DecisionView is one routing decision.
type DecisionView struct {
	Time    time.Time `json:"time"`
	Model   string    `json:"model"`
	Backend string    `json:"backend"`
	Reason  string    `json:"reason"`
	// PromptTokens is the prompt's length (estimated or counted),
	// MaxTokens the output asked for, Cached the prompt tokens the policy
	// expected the chosen backend to hold.
	PromptTokens int `json:"prompt_tokens"`
	MaxTokens    int `json:"max_tokens"`
	Cached       int `json:"cached"`
	// PredictedTTFTMs and its interval; null for policies that do not
	// predict.
	PredictedTTFTMs Num `json:"predicted_ttft_ms"`
	PredictedLowMs  Num `json:"predicted_low_ms"`
	PredictedHighMs Num `json:"predicted_high_ms"`
	// Scored is how many candidates the policy scored; Candidates holds up
	// to 16 of them, cheapest first.
	Scored     int             `json:"scored"`
	Candidates []CandidateView `json:"candidates"`
}

// CandidateView is one candidate's score in a decision.
type CandidateView struct {
	Backend string `json:"backend"`
	// Cost is the policy's cost, lower is better (kvroute: seconds).
	Cost   Num `json:"cost"`
	TTFTMs Num `json:"ttft_ms"`
	Cached int `json:"cached"`
	// Terms breaks Cost into named terms in seconds; absent for policies
	// whose cost is not a sum.
	Terms router.Terms `json:"terms,omitzero"`
}

// Num is a number that may be unknown (NaN), which JSON shows as null.
type Num float64

// unknown is a Num with no value.
var unknown = Num(math.NaN())

func (n Num) unknown() bool { return math.IsNaN(float64(n)) }

// MarshalJSON writes n, or null when it is not a finite number.
func (n Num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, f, 'g', 6, 64), nil
}

// ratio is a/b, unknown when b is not positive.
func ratio(a, b float64) Num {
	if !(b > 0) {
		return unknown
	}
	return Num(a / b)
}
