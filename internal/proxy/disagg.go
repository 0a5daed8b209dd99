package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/upstream"
)

// Disagg configures prefill/decode disaggregation: requests whose
// candidates include prefill-role backends (fleet.RolePrefill) may have
// their prompt prefilled there first, vLLM style (docs/routing.md).
type Disagg struct {
	// Splitter decides per request whether to go through the prefill pool
	// and on which prefill server. Nil means router.SplitAlways.
	Splitter router.Splitter
	// PrefillTimeout bounds one prefill leg, from its send to its whole
	// answer. Zero means DefaultPrefillTimeout.
	PrefillTimeout time.Duration
	// PrefillAttempts is how many prefill servers one request tries before
	// it is served whole on its decode server. Zero means
	// DefaultPrefillAttempts.
	PrefillAttempts int
}

// DefaultPrefillTimeout covers the prefill of a 128k-token prompt behind a
// queue on one GPU; a leg that takes longer is better served whole.
const DefaultPrefillTimeout = 30 * time.Second

// DefaultPrefillAttempts tries a second prefill server when the first
// fails, as llm-d's sidecar and vLLM's router do; beyond it the decode
// server prefills itself.
const DefaultPrefillAttempts = 2

// maxPrefillAnswer bounds the prefill leg's answer read into memory: one
// token and the transfer parameters (a block id per 16 tokens of a 128k
// prompt is under 64 KiB).
const maxPrefillAnswer = 1 << 20

func (d Disagg) withDefaults() Disagg {
	if d.Splitter == nil {
		d.Splitter = router.SplitAlways{}
	}
	if d.PrefillTimeout <= 0 {
		d.PrefillTimeout = DefaultPrefillTimeout
	}
	if d.PrefillAttempts <= 0 {
		d.PrefillAttempts = DefaultPrefillAttempts
	}
	return d
}

// disaggMetrics count the prefill legs and their outcomes.
type disaggMetrics struct {
	decisions *prometheus.CounterVec // splitter, decision
	legs      *prometheus.CounterVec // backend, outcome
	fallbacks prometheus.Counter
	legTime   prometheus.Histogram
}

func newDisaggMetrics(reg prometheus.Registerer) (*disaggMetrics, error) {
	m := &disaggMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_pd_decisions_total",
			Help: `Requests with prefill servers among their candidates, by splitter and decision ("split": through the prefill pool, "whole": prefilled on the decode server).`},
			[]string{"splitter", "decision"}),
		legs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_prefill_legs_total",
			Help: `Prefill legs sent, by prefill backend and outcome: "ok", "dial", "reset", "timeout", "status" (a non-2xx answer), "no_params" (an answer without kv_transfer_params).`},
			[]string{"backend", "outcome"}),
		fallbacks: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_pd_fallbacks_total",
			Help: "Requests decided for the prefill pool that every prefill server tried failed, served whole on their decode server."}),
		legTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvroute_prefill_leg_seconds",
			Help: "Time of successful prefill legs, from send to the whole answer.", Buckets: ttftBuckets}),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.legs, m.fallbacks, m.legTime} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("proxy: register the disaggregation metrics: %w", err)
		}
	}
	return m, nil
}

// withRoles takes the prefill-only backends out of a generation's
// candidates; a chat or completion request keeps them for its prefill leg
// (the Responses API has no kv_transfer_params).
func withRoles(c *call, cands []*fleet.Backend) []*fleet.Backend {
	decoders, prefills := fleet.SplitRoles(cands)
	if c.ep == request.Chat || c.ep == request.Completion {
		c.prefills = prefills
	}
	return decoders
}

// priceSplit gives c's pick the price of its way through the prefill pool
// when the splitter prices one (router.SplitPricer), so that the policy
// chooses the decode server of a request that will split for the split.
// A retry, which has no prefill pool left (disaggregate), is priced whole.
func (p *Proxy) priceSplit(c *call) {
	c.req.SplitTTFT = 0
	sp, ok := p.disagg.Splitter.(router.SplitPricer)
	if !ok || len(c.prefills) == 0 {
		return
	}
	p.router.Estimate(c.req)
	c.req.SplitTTFT = sp.SplitTTFT(c.req, c.prefills)
}

// disaggregate asks the splitter whether c, routed to t's decode server,
// goes through the prefill pool; if so it sends the prefill leg (another
// prefill server when one fails) and gives c's body the KV transfer
// parameters the prefill returned. When every prefill server tried fails,
// c's body stays as it was: the decode server prefills it itself, and the
// client sees no error.
func (p *Proxy) disaggregate(r *http.Request, c *call, t *router.Ticket) {
	defer func() { c.prefills = nil }() // once: a held request keeps its first leg's KV
	d := &p.disagg
	pb := d.Splitter.Split(c.req, &t.Decision, c.prefills, p.rand)
	if pb == nil {
		p.dmetrics.decisions.WithLabelValues(d.Splitter.Name(), "whole").Inc()
		return
	}
	p.dmetrics.decisions.WithLabelValues(d.Splitter.Name(), "split").Inc()
	if pb.BootstrapPort() > 0 && p.concurrentLegs(r, c, pb) { // sglang.go
		return
	}
	prefillBody, err := prefillRequest(c.body)
	if err != nil { // the body was parsed already: not expected
		p.log.Warn("prefill leg not sent", "request_id", c.id, "err", err)
		return
	}
	left := slices.Clone(c.prefills) // Without edits in place
	for range d.PrefillAttempts {
		params, outcome, err := p.prefillLeg(r, c, pb, prefillBody)
		p.dmetrics.legs.WithLabelValues(pb.Name, outcome).Inc()
		if outcome == "ok" {
			if body, err := withTransferParams(c.body, params); err == nil {
				c.body = body
				return
			}
			break
		}
		p.log.Warn("prefill leg failed", "request_id", c.id, "backend", pb.Name, "outcome", outcome, "err", err)
		if left = router.Without(left, pb); len(left) == 0 || r.Context().Err() != nil {
			break
		}
		pb = router.LeastPrefill(left, p.rand)
	}
	p.dmetrics.fallbacks.Inc()
	p.log.Warn("no prefill server took the request: prefilling on the decode server", "request_id", c.id, "backend", t.Backend.Name)
}

// prefillLeg sends body, c's prefill request, to b and returns the
// kv_transfer_params of its answer, or the outcome that says why there are
// none. The leg's load is counted on b while it runs.
func (p *Proxy) prefillLeg(r *http.Request, c *call, b *fleet.Backend, body []byte) (json.RawMessage, string, error) {
	preq := *c.req
	preq.MaxTokens = 1
	t, err := p.prefillRouter.Route(&preq, []*fleet.Backend{b})
	if err != nil {
		return nil, "dial", err
	}
	start := p.now()
	out := router.Failed(0)
	complete := false
	defer func() {
		t.Finish(out)
		// The prefill server's health counts as any backend's (outlier.go).
		if r, ok := fleet.ResultOf(out.Status, complete, 0, 0); ok {
			p.fleet.Report(b, r)
		}
	}()
	ctx, cancel := context.WithTimeout(r.Context(), p.disagg.PrefillTimeout)
	defer cancel()
	req := p.withCredentials(upstream.NewRequest(ctx, r, b.URL, body), b)
	req.Header.Set(HeaderRequestID, c.id) // both legs under one id, as vLLM's proxies send them
	res, err := p.transport.RoundTrip(req)
	switch {
	case err != nil && isDialError(err):
		p.fleet.MarkFailed(b, err)
		return nil, "dial", err
	case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		p.fleet.Report(b, fleet.Result{Kind: fleet.ResultTimeout})
		return nil, "timeout", err
	case err != nil:
		p.fleet.Report(b, fleet.Result{Kind: fleet.ResultGatewayError})
		return nil, "reset", err
	}
	defer res.Body.Close()
	out.Status = res.StatusCode
	if res.StatusCode == http.StatusTooManyRequests {
		p.fleet.Backoff(b, time.Now().Add(max(retryAfter(res.Header), backoffFor)))
	}
	data, err := io.ReadAll(io.LimitReader(res.Body, maxPrefillAnswer))
	switch {
	case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, "timeout", err
	case err != nil:
		return nil, "reset", err
	case res.StatusCode/100 != 2:
		return nil, "status", fmt.Errorf("prefill server answered %d", res.StatusCode)
	}
	complete = true
	t.FirstToken()
	var answer struct {
		Params json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(data, &answer); err != nil || len(answer.Params) == 0 || answer.Params[0] != '{' {
		return nil, "no_params", fmt.Errorf("the prefill answer has no kv_transfer_params object (%v)", err)
	}
	p.dmetrics.legTime.Observe(p.now().Sub(start).Seconds())
	return answer.Params, "ok", nil
}

// remoteDecode is the kv_transfer_params of a prefill leg, as vLLM's
// NixlConnector reads them: keep the KV blocks for a remote decode, and
// nothing to pull.
var remoteDecode = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// prefillRequest rewrites a chat or completion body into its prefill leg:
// one output token, not streamed, no stream options, no minimum output
// (vLLM's prefill refuses min_tokens above max_tokens), and the transfer
// parameters asking the server to keep the KV for a remote decode.
func prefillRequest(body []byte) ([]byte, error) { return prefillLeg(body, true) }

// prefillLeg is prefillRequest, with vLLM's transfer parameters only when
// vllm is set (SGLang's legs meet by their bootstrap room instead).
func prefillLeg(body []byte, vllm bool) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	one := json.RawMessage("1")
	m["max_tokens"] = one
	if _, ok := m["max_completion_tokens"]; ok {
		m["max_completion_tokens"] = one
	}
	m["stream"] = json.RawMessage("false")
	delete(m, "stream_options")
	delete(m, "min_tokens")
	delete(m, "min_completion_tokens")
	if vllm {
		m["kv_transfer_params"] = remoteDecode
	}
	return json.Marshal(m)
}

// withTransferParams returns body with its kv_transfer_params set to
// params, the prefill's answer, for the decode server to pull the KV.
func withTransferParams(body []byte, params json.RawMessage) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, params); err != nil {
		return nil, err
	}
	m["kv_transfer_params"] = compact.Bytes()
	return json.Marshal(m)
}
