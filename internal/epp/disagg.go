package epp

import (
	"math/rand/v2"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/baseline"
)

// HeaderPrefiller names the prefill endpoint (ip:port) of a request the
// picker splits: llm-d's decode-side routing sidecar reads it, sends the
// prompt there first and then the request to its own decode server. It is
// removed from every request the picker does not split, so that a client
// cannot choose a prefill server.
const HeaderPrefiller = "x-prefiller-host-port"

// newPrefillRouter counts the prefill legs on the prefill endpoints; the
// splitter has chosen the endpoint, the router only counts the leg there.
func newPrefillRouter() *router.Router {
	return router.NewRouter(baseline.NewLeastRequestRand(rand.IntN), nil)
}

// withRoles takes the prefill-only endpoints out of a generation's
// candidates; a chat or completion request keeps them for its prefill leg.
func (x *exchange) withRoles(cands []*fleet.Backend) []*fleet.Backend {
	decoders, prefills := fleet.SplitRoles(cands)
	if x.path == "/v1/chat/completions" || x.path == "/v1/completions" {
		x.prefills = prefills
	}
	return decoders
}

// priceSplit gives req's pick the price of its way through the prefill
// endpoints when the splitter prices one (router.SplitPricer), so that the
// policy chooses the decode endpoint of a request that will split for the
// split.
func (x *exchange) priceSplit(req *router.Request) {
	sp, ok := x.p.opts.Splitter.(router.SplitPricer)
	if !ok || len(x.prefills) == 0 {
		return
	}
	x.p.router.Estimate(req)
	req.SplitTTFT = sp.SplitTTFT(req, x.prefills)
}

// split asks the splitter whether req, routed to t's decode endpoint, is
// prefilled first on a prefill endpoint; if so it names it for the reply's
// HeaderPrefiller and counts the leg there until the response's first
// token (the sidecar's prefill ends before its decode begins).
func (x *exchange) split(req *router.Request, t *router.Ticket) {
	if len(x.prefills) == 0 || x.p.opts.Splitter == nil {
		return
	}
	b := x.p.opts.Splitter.Split(req, &t.Decision, x.prefills, intN)
	if b == nil {
		x.p.metrics.requests.WithLabelValues("pd_whole").Inc()
		return
	}
	preq := *req
	preq.MaxTokens = 1
	pt, err := x.p.prefillRouter.Route(&preq, []*fleet.Backend{b})
	if err != nil {
		return
	}
	x.pt, x.prefill = pt, Address(b)
	x.p.metrics.requests.WithLabelValues("pd_split").Inc()
}

// endPrefill releases the prefill leg's count.
func (x *exchange) endPrefill() {
	if x.pt != nil {
		x.pt.FirstToken()
		x.pt.Finish(router.Outcome{Status: 200, PromptTokens: -1, CachedTokens: -1, CompletionTokens: -1})
		x.pt = nil
	}
}

// withPrefiller sets HeaderPrefiller on the header reply r when the
// request is split, and removes any the client sent otherwise.
func (x *exchange) withPrefiller(r *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	m := r.GetRequestHeaders().GetResponse().GetHeaderMutation()
	if m == nil {
		return r
	}
	if x.prefill != "" {
		m.SetHeaders = append(m.SetHeaders, setHeader(HeaderPrefiller, x.prefill))
	} else {
		m.RemoveHeaders = append(m.RemoveHeaders, HeaderPrefiller)
	}
	return r
}
