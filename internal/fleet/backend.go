// Package fleet holds the backends kvroute routes to: their identity, the
// models they serve, their health, the load signals scraped from them and the
// router's own exact, immediate count of the work it has sent them.
package fleet

import (
	"net/url"
	"sync/atomic"
	"time"
)

// Backend is one inference server. Its identity is fixed at construction;
// everything that changes is atomic, so a Backend is safe for concurrent use
// and the hot path reads it without locks.
type Backend struct {
	// Index is the backend's position in its fleet, stable for its life.
	Index int
	// Name is the backend's name, shown in X-Kvroute-Backend.
	Name string
	// URL is the backend's base URL (scheme and host, maybe a path prefix).
	URL *url.URL
	// APIKey, if set, is sent to the backend as "Authorization: Bearer" on
	// proxied requests and on probes (a vLLM started with --api-key
	// answers 401 without it). Set it before the backend is used; it is
	// redacted when printed.
	APIKey Secret
	// Labels describe the backend where its source knows them (an
	// InferencePool's pods: their labels, such as model, accelerator or
	// adapter set); nil otherwise. Set before the backend is used, never
	// changed after.
	Labels map[string]string
	// GPUMetricsURL, if set, is a GPU exporter's metrics page (NVIDIA's
	// DCGM exporter) scraped with the backend's /metrics for the GPU
	// signals its own page lacks; GPUPod, if set, keeps only the series
	// labelled with that Kubernetes pod (an exporter serving a whole
	// node). Set before the backend is used, never changed after.
	GPUMetricsURL *url.URL
	GPUPod        string
	// Rank and Ranks, when Ranks > 1, make the backend one data-parallel
	// rank of a server behind URL (rank.go): requests carry the rank in
	// the X-data-parallel-rank header and its metrics are the series
	// labelled engine="Rank". Set before the backend is used, never
	// changed after.
	Rank, Ranks int

	healthy atomic.Bool
	info    atomic.Pointer[Info]
	metrics atomic.Pointer[Metrics]
	// peerLoad is the other router replicas' in-flight work here (see
	// PeerLoad), nil when they report none.
	peerLoad atomic.Pointer[PeerLoad]
	// onLoad, when set, is told of every change of the counts below
	// (WatchLoad).
	onLoad atomic.Pointer[func(*Backend)]
	// onPeerLoad, when set, is told of every new peerLoad
	// (WatchPeerLoad).
	onPeerLoad atomic.Pointer[func(*Backend)]

	// Router-side accounting, changed the moment a request is routed and
	// released as it progresses (see Load).
	requests      atomic.Int64
	prefillTokens atomic.Int64
	decodeTokens  atomic.Int64
	decoding      atomic.Int64
}

// Info is what a backend says about itself, learned at discovery.
type Info struct {
	// Models are the model ids the backend serves (from /v1/models).
	Models []string
	// Adapters are those of Models that are LoRA adapters of another (a
	// parent in /v1/models, as vLLM lists them).
	Adapters []string
	// BlockSize and KVBlocks describe its KV cache (from
	// vllm:cache_config_info, 0 when unknown).
	BlockSize, KVBlocks int
}

// Serves reports whether the backend serves model.
func (i *Info) Serves(model string) bool {
	if i == nil {
		return false
	}
	for _, m := range i.Models {
		if m == model {
			return true
		}
	}
	return false
}

// KVTokens is the KV capacity in tokens, 0 when unknown.
func (i *Info) KVTokens() int {
	if i == nil {
		return 0
	}
	return i.BlockSize * i.KVBlocks
}

// Metrics are the load signals scraped from a backend's /metrics, in the
// units of the engine's own names (vLLM, SGLang or llama.cpp).
type Metrics struct {
	// Running and Waiting are the engine's batch and queue lengths.
	Running, Waiting float64
	// KVUsage is the fraction of KV cache in use, in [0, 1]; negative when
	// the engine does not report it. For llama.cpp it comes from /slots:
	// the context held by busy slots over all slots' context.
	KVUsage float64
	// PrefixHits and PrefixQueries are the engine's cumulative prefix-cache
	// counters in tokens (0 when not reported).
	PrefixHits, PrefixQueries float64
	// BusySeconds is the engine's cumulative compute time, in seconds
	// (llama.cpp: prompt plus generation time, summed over slots); 0 when
	// not reported.
	BusySeconds float64
	// Slots and SlotContext describe a llama.cpp server's parallel slots
	// (from /slots): how many, and the context each can hold, in tokens
	// (the smallest, if they differ). 0 for other engines.
	Slots, SlotContext int
	// GPUUtil is the GPU utilisation, the share of time a kernel ran, in
	// [0, 1] (DCGM_FI_DEV_GPU_UTIL / 100), averaged over the backend's
	// GPUs; SMActive is DCGM_FI_PROF_SM_ACTIVE likewise. Read from the
	// backend's /metrics or its GPUMetricsURL; -1 when neither exports it.
	GPUUtil, SMActive float64
	// LoRA is the engine's adapter residency (vllm:lora_requests_info);
	// nil when it serves no adapters.
	LoRA *LoRAInfo
	// At is when the scrape finished.
	At time.Time
}

// NewBackend returns a backend that is healthy until told otherwise.
func NewBackend(index int, name string, u *url.URL) *Backend {
	b := &Backend{Index: index, Name: name, URL: u}
	b.healthy.Store(true)
	return b
}

// Healthy reports whether the backend is in rotation.
func (b *Backend) Healthy() bool { return b.healthy.Load() }

// SetHealthy changes the backend's health and reports whether that was a
// change (so that callers log transitions once).
func (b *Backend) SetHealthy(ok bool) bool { return b.healthy.Swap(ok) != ok }

// Info returns what the backend said about itself, or nil before discovery.
func (b *Backend) Info() *Info { return b.info.Load() }

// SetInfo records what the backend said about itself.
func (b *Backend) SetInfo(i *Info) { b.info.Store(i) }

// Metrics returns the latest scraped metrics, or nil if they are older than
// maxAge at now (stale metrics are not to be trusted) or there are none.
func (b *Backend) Metrics(now time.Time, maxAge time.Duration) *Metrics {
	m := b.metrics.Load()
	if m == nil || now.Sub(m.At) > maxAge {
		return nil
	}
	return m
}

// SetMetrics records a scrape.
func (b *Backend) SetMetrics(m *Metrics) { b.metrics.Store(m) }

// Load is the router's own count of the work in flight on a backend.
type Load struct {
	// Requests routed there and not yet finished.
	Requests int64
	// PrefillTokens are the uncached prompt tokens of requests whose first
	// token has not arrived: the prefill work queued there.
	PrefillTokens int64
	// Decoding is the number of requests past their first token.
	Decoding int64
	// DecodeTokens are the context tokens (prompt plus expected output) of
	// requests that are decoding or will decode: the KV they hold.
	DecodeTokens int64
}

// Load returns the backend's in-flight work.
func (b *Backend) Load() Load {
	return Load{
		Requests:      b.requests.Load(),
		PrefillTokens: b.prefillTokens.Load(),
		Decoding:      b.decoding.Load(),
		DecodeTokens:  b.decodeTokens.Load(),
	}
}

// WatchLoad makes fn be called with b after every change of b's in-flight
// counts (Start, FirstToken, Done), on the goroutine that made it, once
// the counts are updated; nil stops it. fn runs on the request path: it
// must be cheap and must never block (a replica pushing its counts to its
// peers marks b changed and wakes its writers, internal/peers). One
// watcher per backend: a second call replaces the first.
func (b *Backend) WatchLoad(fn func(*Backend)) {
	if fn == nil {
		b.onLoad.Store(nil)
		return
	}
	b.onLoad.Store(&fn)
}

// loadChanged tells the watcher, if any, that b's counts changed.
func (b *Backend) loadChanged() {
	if fn := b.onLoad.Load(); fn != nil {
		(*fn)(b)
	}
}

// Start counts a request routed to the backend: prefill is the prompt
// tokens the backend must compute, context the tokens its KV will hold. It
// returns the handle that releases them; call its methods from the request's
// own goroutine.
func (b *Backend) Start(prefill, context int) *Flight {
	b.requests.Add(1)
	b.prefillTokens.Add(int64(prefill))
	b.decodeTokens.Add(int64(context))
	b.loadChanged()
	return &Flight{b: b, prefill: int64(prefill), context: int64(context)}
}

// Flight is one request's share of a backend's load, released in two parts:
// the prefill at the first token, everything at the end.
type Flight struct {
	b                *Backend
	prefill, context int64
	firstDone, done  bool
}

// FirstToken releases the request's prefill work: it is decoding now.
func (f *Flight) FirstToken() {
	if f.firstDone || f.done {
		return
	}
	f.firstDone = true
	f.b.prefillTokens.Add(-f.prefill)
	f.b.decoding.Add(1)
	f.b.loadChanged()
}

// Done releases everything the request still holds. Calling it again does
// nothing.
func (f *Flight) Done() {
	if f.done {
		return
	}
	if !f.firstDone {
		f.b.prefillTokens.Add(-f.prefill)
	} else {
		f.b.decoding.Add(-1)
	}
	f.done = true
	f.b.decodeTokens.Add(-f.context)
	f.b.requests.Add(-1)
	f.b.loadChanged()
}
