package emulator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Disagg is the emulator's part in prefill/decode disaggregation, as a vLLM
// server started with NixlConnector plays it (docs/engine-model.md).
type Disagg struct {
	// Role is "" (no KV connector: kv_transfer_params are ignored), "prefill"
	// (answers a request asking for a remote decode with the transfer
	// parameters of its KV), "decode" (pulls the KV a request's transfer
	// parameters name) or "both".
	Role string
	// LinkBandwidth is the KV transfer's bandwidth in bytes/s; 0 means
	// DefaultLinkBandwidth.
	LinkBandwidth float64
	// Hold is how long a prefill server keeps a finished prefill's KV for
	// its decode server to pull (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT); 0
	// means DefaultKVHold.
	Hold time.Duration
	// EngineID names this server's engine in the transfer parameters; ""
	// means a random one.
	EngineID string
	// BootstrapTimeout bounds a decode's wait for its SGLang room's
	// prefill (bootstrap.go); 0 means DefaultBootstrapTimeout.
	BootstrapTimeout time.Duration
}

// DefaultLinkBandwidth is RDMA at 200 Gb/s between prefill and decode GPUs.
const DefaultLinkBandwidth = 25e9

// DefaultKVHold is vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT: 480 s.
const DefaultKVHold = 480 * time.Second

// pullTimeout bounds a decode server's read of the prefill server's side
// channel.
const pullTimeout = 5 * time.Second

// nixlPath is the side channel a decode emulator pulls a prefill's KV
// through: GET nixlPath + remote_request_id ?engine= remote_engine_id.
const nixlPath = "/kvroute/nixl/"

// kvParams are the kv_transfer_params fields the emulator reads and writes,
// those of vLLM's NixlConnector.
type kvParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteBlockIDs  []int   `json:"remote_block_ids"`
	RemoteRequestID string  `json:"remote_request_id,omitempty"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	TPSize          int     `json:"tp_size,omitempty"`
}

// held is a finished prefill's KV, kept for its decode server.
type held struct {
	prompt  uint64 // chain hash of the prompt's full blocks: the decode checks it is its prompt
	tokens  int
	expires time.Time
}

// pd is a server's disaggregation state.
type pd struct {
	cfg    Disagg
	client *http.Client

	mu    sync.Mutex
	held  map[string]held
	rooms map[uint64]*room // SGLang's (bootstrap.go)

	xferTime  prometheus.Histogram
	xferBytes prometheus.Histogram
	failed    prometheus.Counter
	expired   prometheus.Counter
}

func newPD(cfg Disagg, reg prometheus.Registerer, model string) (*pd, error) {
	switch cfg.Role {
	case "", "prefill", "decode", "both":
	default:
		return nil, fmt.Errorf("emulator: kv role %q: want prefill, decode or both", cfg.Role)
	}
	if cfg.LinkBandwidth < 0 || cfg.Hold < 0 {
		return nil, fmt.Errorf("emulator: link bandwidth and KV hold must not be negative")
	}
	if cfg.LinkBandwidth == 0 {
		cfg.LinkBandwidth = DefaultLinkBandwidth
	}
	if cfg.Hold == 0 {
		cfg.Hold = DefaultKVHold
	}
	if cfg.BootstrapTimeout <= 0 {
		cfg.BootstrapTimeout = DefaultBootstrapTimeout
	}
	if cfg.EngineID == "" {
		cfg.EngineID = randomHex()
	}
	l := prometheus.Labels{"model_name": model}
	p := &pd{cfg: cfg, client: &http.Client{Timeout: pullTimeout}, held: make(map[string]held),
		xferTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:nixl_xfer_time_seconds", ConstLabels: l,
			Help: "Histogram of transfer duration for NIXL KV Cache transfers (model time).", Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 5}}),
		xferBytes: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:nixl_bytes_transferred", ConstLabels: l,
			Help: "Histogram of bytes transferred per NIXL KV Cache transfers.", Buckets: prometheus.ExponentialBuckets(1<<20, 4, 10)}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:nixl_num_failed_transfers_total", ConstLabels: l,
			Help: "Number of failed NIXL KV Cache transfers: the request was prefilled here instead."}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:nixl_num_kv_expired_reqs_total", ConstLabels: l,
			Help: "Number of requests whose held KV expired before a decode server read it."}),
	}
	for _, c := range []prometheus.Collector{p.xferTime, p.xferBytes, p.failed, p.expired} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (p *pd) producer() bool { return p.cfg.Role == "prefill" || p.cfg.Role == "both" }
func (p *pd) consumer() bool { return p.cfg.Role == "decode" || p.cfg.Role == "both" }

// readParams reads a request's kv_transfer_params; nil when absent, null or
// when the server has no KV connector.
func (s *Server) readParams(raw json.RawMessage) (*kvParams, error) {
	if s.pd.cfg.Role == "" || len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var kp kvParams
	if err := json.Unmarshal(raw, &kp); err != nil {
		return nil, fmt.Errorf("kv_transfer_params: %v", err)
	}
	return &kp, nil
}

// pull fetches the KV that kp names for c's prompt from the prefill server
// and waits out its transfer over the link; it returns the prompt tokens
// pulled, 0 when the transfer failed and c is prefilled here (vLLM's
// recompute policy on a failed KV load).
func (s *Server) pull(ctx context.Context, c *call, kp *kvParams) int {
	p := s.pd
	if !p.consumer() || !kp.DoRemotePrefill {
		return 0
	}
	tokens, err := p.fetch(ctx, kp, promptKey(c, s.profile.BlockSize))
	if err != nil {
		p.failed.Inc()
		s.log.Warn("KV transfer failed: prefilling here", "err", err)
		return 0
	}
	tokens = min(tokens, c.req.PromptLen-1)
	if s.transfer(ctx, tokens) != nil { // bootstrap.go
		return 0
	}
	return tokens
}

// fetch reads the prefill server's side channel for kp's request: how many
// tokens of which prompt it holds.
func (p *pd) fetch(ctx context.Context, kp *kvParams, prompt uint64) (int, error) {
	if kp.RemoteHost == nil || kp.RemotePort == nil || kp.RemoteEngineID == nil || kp.RemoteRequestID == "" {
		return 0, fmt.Errorf("kv_transfer_params name no remote host, port, engine and request")
	}
	u := url.URL{Scheme: "http", Host: net.JoinHostPort(*kp.RemoteHost, strconv.Itoa(*kp.RemotePort)),
		Path: nixlPath + kp.RemoteRequestID, RawQuery: url.Values{"engine": {*kp.RemoteEngineID}}.Encode()}
	n, err := heldAt(ctx, p.client, u.String(), prompt)
	if err != nil {
		return 0, fmt.Errorf("prefill server %s: %w", u.Host, err)
	}
	return n, nil
}

// heldAt asks the prefill server at u (its side channel for a request, or
// a bootstrap room) how many tokens of prompt's KV it holds.
func heldAt(ctx context.Context, client *http.Client, u string, prompt uint64) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	res, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("answered %d", res.StatusCode)
	}
	var h struct {
		Tokens int    `json:"tokens"`
		Prompt string `json:"prompt"`
	}
	if err := json.NewDecoder(res.Body).Decode(&h); err != nil {
		return 0, err
	}
	if h.Prompt != strconv.FormatUint(prompt, 16) {
		return 0, errors.New("it holds another prompt's KV")
	}
	return h.Tokens, nil
}

// promptKey is the chain hash of c's last full prompt block: equal on two
// servers exactly when they saw the same prompt.
func promptKey(c *call, blockSize int) uint64 {
	n := min(c.req.PromptLen/blockSize, len(c.req.BlockHashes))
	if n == 0 {
		return uint64(c.req.PromptLen)
	}
	return c.req.BlockHashes[n-1]
}

// hold keeps finished prefill c's KV for a remote decode and returns the
// transfer parameters the response carries; nil unless kp asked for it and
// the prefill ran to its length (vLLM's FINISHED_LENGTH_CAPPED).
func (s *Server) hold(c *call, kp *kvParams, id, host string) *kvParams {
	p := s.pd
	if kp == nil || !p.producer() || !kp.DoRemoteDecode || c.stop {
		return nil
	}
	h, port := sideChannel(host)
	now := s.clock.Now()
	p.mu.Lock()
	for k, v := range p.held { // expire what no decode server read
		if now.After(v.expires) {
			delete(p.held, k)
			p.expired.Inc()
		}
	}
	p.held[id] = held{prompt: promptKey(c, s.profile.BlockSize), tokens: c.req.PromptLen, expires: now.Add(p.cfg.Hold)}
	p.mu.Unlock()
	blocks := make([]int, (c.req.PromptLen+s.profile.BlockSize-1)/s.profile.BlockSize)
	for i := range blocks {
		blocks[i] = int(c.req.ID)<<12 | i // ids, as vLLM's, of this server's blocks
	}
	engine := p.cfg.EngineID
	return &kvParams{DoRemotePrefill: true, RemoteEngineID: &engine, RemoteBlockIDs: blocks,
		RemoteRequestID: id, RemoteHost: &h, RemotePort: &port, TPSize: 1}
}

// sideChannel is the host and port a decode server reaches this one at:
// those its client used.
func sideChannel(host string) (string, int) {
	h, ps, err := net.SplitHostPort(host)
	if err != nil {
		return host, 80
	}
	port, _ := strconv.Atoi(ps)
	return h, port
}

// handleNixl serves a held prefill's KV to the decode server that pulls
// it, once: vLLM frees the blocks when the decode side has read them.
func (s *Server) handleNixl(w http.ResponseWriter, r *http.Request, id string) {
	p := s.pd
	if !p.producer() {
		s.notFound(w, r)
		return
	}
	if r.URL.Query().Get("engine") != p.cfg.EngineID {
		http.Error(w, "unknown engine", http.StatusNotFound)
		return
	}
	p.mu.Lock()
	h, ok := p.held[id]
	delete(p.held, id)
	p.mu.Unlock()
	if !ok || s.clock.Now().After(h.expires) {
		if ok {
			p.expired.Inc()
		}
		http.Error(w, "no KV held for "+strings.ReplaceAll(id, "\n", ""), http.StatusNotFound)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": h.tokens, "prompt": strconv.FormatUint(h.prompt, 16)})
}

// withParams reads raw, a request's kv_transfer_params, into x; a malformed
// one is answered 400 and withParams reports false.
func (s *Server) withParams(w http.ResponseWriter, r *http.Request, x *exchange, raw json.RawMessage, b bootstrap) bool {
	kp, err := s.readParams(raw)
	if err != nil {
		writeError(w, badRequest("kv_transfer_params", "%v", err))
		return false
	}
	x.kv, x.host = kp, r.Host
	if s.pd.cfg.Role != "" && (b.Host != nil || b.Port != nil || b.Room != nil) {
		x.boot = &b // bootstrap.go
	}
	return true
}
