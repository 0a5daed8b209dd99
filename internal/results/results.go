// Package results is what a bench or simulator run measured: the
// per-request results, their summaries, the cache-hit bounds of the
// workload, and the table and JSON they are written as. The live driver
// (package bench) and the simulator (package sim) both produce a Report;
// package report renders it as HTML.
package results

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"time"
)

// Result is one request as the client saw it. Times are in model time.
type Result struct {
	// Session and Turn identify the request in its workload.
	Session int `json:"session"`
	Turn    int `json:"turn"`
	// Heavy marks a turn carrying a long document.
	Heavy bool `json:"heavy,omitempty"`
	// Backend and Route are the router's X-Kvroute-Backend and
	// X-Kvroute-Route headers (empty without a router).
	Backend string `json:"backend,omitempty"`
	Route   string `json:"route,omitempty"`
	// Status is the HTTP status; 0 if the request failed before one.
	Status int `json:"status"`
	// Err is set when the request failed; Error is its text.
	Err   error  `json:"-"`
	Error string `json:"error,omitempty"`
	// A failed request is exactly one of: Lost, when the client got an
	// error status or a transport error before a stream began, so no usable
	// answer; CutWithEvent, when a stream began and ended with an error
	// event (`data: {"error":...}`), which a client can read and act on;
	// CutSilent, when a stream began and then broke off without one (the
	// connection dropped, an unterminated chunked body, no [DONE], a bad
	// event), which a client cannot tell from a network fault.
	Lost         bool `json:"lost,omitempty"`
	CutWithEvent bool `json:"cut_with_event,omitempty"`
	CutSilent    bool `json:"cut_silent,omitempty"`
	// InFault marks a request sent while a fault of the run's schedule
	// (`kvroute bench --faults`) was in force.
	InFault bool `json:"in_fault,omitempty"`
	// Migrated marks a stream that completed although a fault of the run's
	// schedule cut it on the backend that began it (the router's
	// X-Kvroute-Backend); CutBy names the fault: "kill" (killed while it
	// streamed), "stall" (its first token, then nothing) or "die" (cut
	// after a few tokens). MaxGap is the longest wait between two of the
	// stream's content chunks: for a migrated stream, the time from the
	// cut to the first continued token, within a decode step (after a
	// stall, from the last token, the router's idle timeout included).
	Migrated bool          `json:"migrated,omitempty"`
	CutBy    string        `json:"cut_by,omitempty"`
	MaxGap   time.Duration `json:"max_gap_ns,omitempty"`
	// TextWrong marks a completed reply whose text is not the one the
	// emulated backends give that prompt (their replies are a function of
	// the seed and the prompt, wherever they run): a token lost or doubled
	// where a stream was spliced. Checked only by a bench client that knows
	// the emulators' seed.
	TextWrong bool `json:"text_wrong,omitempty"`
	// Sent is when the request was sent, from the start of the run.
	Sent time.Duration `json:"sent_ns"`
	// TTFT is the time to the first content token; E2E to the end.
	TTFT time.Duration `json:"ttft_ns"`
	E2E  time.Duration `json:"e2e_ns"`
	// ITL is the mean time between content chunks after the first; 0
	// with fewer than two.
	ITL time.Duration `json:"itl_ns"`
	// ServerTTFT is the TTFT the backend itself reported (the emulator's
	// X-Kvroute-Model-Ttft trailer; llama-server's timings.prompt_ms, its
	// prefill compute without the wait for a slot), free of the client's
	// and the router's wall-clock noise; 0 when not reported.
	ServerTTFT time.Duration `json:"server_ttft_ns,omitempty"`
	// PromptTokens, CachedTokens and CompletionTokens are the response's usage.
	PromptTokens     int `json:"prompt_tokens"`
	CachedTokens     int `json:"cached_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	// PredictedCached is the prompt tokens the policy expected cached on
	// the backend it chose (router.Decision.Cached; 0 for policies that
	// do not predict).
	PredictedCached int `json:"predicted_cached,omitempty"`
	// PredictedTTFT is the TTFT the policy routed the request on
	// (router.Decision.PredictedTTFT, the X-Kvroute-Predicted-Ttft header),
	// and PredictedTTFTLow and PredictedTTFTHigh its prediction interval; 0
	// for policies that do not predict.
	PredictedTTFT     time.Duration `json:"predicted_ttft_ns,omitempty"`
	PredictedTTFTLow  time.Duration `json:"predicted_ttft_low_ns,omitempty"`
	PredictedTTFTHigh time.Duration `json:"predicted_ttft_high_ns,omitempty"`
	// PredictedITL is the mean time between the stream's tokens the policy
	// predicted there (router.Decision.PredictedITL, the
	// X-Kvroute-Predicted-Itl header); 0 for policies that do not predict.
	PredictedITL time.Duration `json:"predicted_itl_ns,omitempty"`
	// PromptBlocks and SequenceBlocks are the block hashes recorded when
	// bench.Client.BlockTokens is set (or by the simulator).
	PromptBlocks, SequenceBlocks []uint64 `json:"-"`
}

// Report is everything one `kvroute bench` run measured: the same workload
// on the same fleet once per policy. It is written as results.json and
// rendered as report.html.
type Report struct {
	// Workload names the workload (e.g. "mooncake:conversation_trace.jsonl").
	Workload string `json:"workload"`
	// Description says in a sentence what the workload is and at what load.
	Description string `json:"description"`
	// Backends is the fleet size; Profile the engine profile of each.
	Backends int    `json:"backends"`
	Profile  string `json:"profile"`
	// KVTokensPerBackend is each backend's KV capacity in tokens.
	KVTokensPerBackend int `json:"kv_tokens_per_backend"`
	// TimeScale is wall seconds per model second; all times are model time.
	TimeScale float64 `json:"time_scale"`
	// Simulated marks a run of `kvroute sim`: virtual time, no wall clock;
	// Routers is its number of router replicas.
	Simulated bool `json:"simulated,omitempty"`
	Routers   int  `json:"routers,omitempty"`
	// Seed makes the arrivals and replies reproducible.
	Seed uint64 `json:"seed"`
	// Created is when the run started.
	Created time.Time `json:"created"`
	// Bounds are the cache hit rates no router can beat on this workload.
	Bounds Bounds `json:"bounds"`
	// Runs holds one entry per policy, in the order run.
	Runs []Run `json:"runs"`
}

// Bounds are prompt-cache hit rates (cached prompt tokens / prompt tokens)
// that bound what any router can reach on a workload.
type Bounds struct {
	// Unlimited: every repeated block hits (one server, infinite KV).
	Unlimited float64 `json:"unlimited"`
	// Ideal: one LRU cache pooling every backend's KV blocks, holding no
	// block twice: a perfect router at the fleet's real capacity.
	Ideal float64 `json:"ideal"`
}

// Run is one policy's measurements.
type Run struct {
	// Policy is the --policy value (or a real balancer's name, e.g.
	// "nginx-least-conn").
	Policy string `json:"policy"`
	// Summary aggregates the requests.
	Summary Summary `json:"summary"`
	// Requests are the per-request results, in completion order.
	Requests []Result `json:"requests"`
	// Backends are per-backend totals and load over time.
	Backends []BackendSeries `json:"backends"`
	// Goodput is the rate search, when one was asked for.
	Goodput *Goodput `json:"goodput,omitempty"`
}

// BackendSeries is one backend's load during a run.
type BackendSeries struct {
	Name string `json:"name"`
	// Busy is the model time the backend spent computing.
	Busy time.Duration `json:"busy_ns"`
	// PromptTokens and CachedTokens are the backend's own counters.
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	// Samples are taken at regular intervals of model time.
	Samples []LoadSample `json:"samples"`
}

// LoadSample is a backend's state at one moment.
type LoadSample struct {
	// At is the model time since the start of the run.
	At time.Duration `json:"at_ns"`
	// Running and Waiting are the engine's queue lengths.
	Running int `json:"running"`
	Waiting int `json:"waiting"`
	// KVUsage is the fraction of KV blocks in use.
	KVUsage float64 `json:"kv_usage"`
}

// Goodput is the result of a search over arrival rates: the highest rate
// at which p99 TTFT stays under the SLO.
type Goodput struct {
	// SLO is the p99 TTFT target.
	SLO time.Duration `json:"slo_ns"`
	// Rate is the highest rate (requests/s) found to meet the SLO; 0 if
	// none did.
	Rate float64 `json:"rate"`
	// Points are the rates tried, in order.
	Points []GoodputPoint `json:"points"`
}

// GoodputPoint is one trial of a goodput search.
type GoodputPoint struct {
	Rate    float64       `json:"rate"`
	TTFTP99 time.Duration `json:"ttft_p99_ns"`
	Errors  int           `json:"errors"`
	Met     bool          `json:"met"`
}

// WriteJSON writes r to dir/results.json, creating dir.
func (r *Report) WriteJSON(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "results.json"), append(data, '\n'), 0o644)
}

// WriteTable prints the runs' summaries side by side, with the bounds.
func (r *Report) WriteTable(w io.Writer) error {
	sums := make([]Summary, len(r.Runs))
	for i, run := range r.Runs {
		sums[i] = run.Summary
	}
	return WriteTable(w, sums, r.Bounds)
}
