package sim

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/router/baseline"
	"github.com/kvroute/kvroute/internal/router/policies"
)

// SplitSep separates a policy from its prefill/decode splitter in a run's
// name: kvroute@priced routes with kvroute and splits with the priced
// decision (Config.Prefill).
const SplitSep = "@"

// DefaultLinkBandwidth is the KV link between prefill and decode servers
// when Config.LinkBandwidth is zero: 200 Gb/s RDMA.
const DefaultLinkBandwidth = 25e9

// pdState is a disaggregated fleet's state: servers [0, decoders) decode,
// the rest prefill.
type pdState struct {
	decoders int
	splitter router.Splitter
	rand     *rand.Rand
	// link is the transfer's bytes/s; kvBytes the model's KV per token.
	link, kvBytes float64
	// prefillRouters count each replica's prefill legs on its prefill
	// servers (least requests, as the proxy's).
	prefillRouters []*router.Router
	legs, splits   int
}

// splitPolicy cuts a run's name into its policy and splitter ("" when it
// names none).
func splitPolicy(name string) (policy, splitter string) {
	policy, splitter, _ = strings.Cut(name, SplitSep)
	return policy, splitter
}

// newPD sets up the prefill pool of a run whose splitter is name.
func newPD(cfg Config, name string) (*pdState, error) {
	if cfg.Prefill <= 0 {
		if name != "" {
			return nil, fmt.Errorf("sim: splitter %q with no prefill servers (Config.Prefill)", name)
		}
		return nil, nil
	}
	if cfg.Prefill >= cfg.Backends {
		return nil, fmt.Errorf("sim: %d prefill servers of %d leave none to decode", cfg.Prefill, cfg.Backends)
	}
	if name == "" {
		name = policies.DefaultSplitter
	}
	link := cfg.LinkBandwidth
	if link <= 0 {
		link = DefaultLinkBandwidth
	}
	o := cfg.Split
	o.Price.KVBytesPerToken, o.Price.LinkBandwidth = cfg.Profile.KVBytesPerToken(), link
	sp, err := policies.NewSplitter(name, o)
	if err != nil {
		return nil, err
	}
	return &pdState{decoders: cfg.Backends - cfg.Prefill, splitter: sp, link: link, kvBytes: cfg.Profile.KVBytesPerToken(),
		rand: rand.New(rand.NewPCG(cfg.Seed, 0x7064))}, nil
}

// setupPD labels each replica's prefill servers and gives it a router for
// its prefill legs.
func (s *simulation) setupPD() {
	for _, rep := range s.replicas {
		for _, b := range rep.backends[s.pd.decoders:] {
			b.SetRole(fleet.RolePrefill)
		}
		s.pd.prefillRouters = append(s.pd.prefillRouters,
			router.NewRouter(baseline.NewLeastRequestRand(s.pd.rand.IntN), nil))
	}
}

// decoders are the servers a replica's policy routes to: all of them
// without a prefill pool.
func (s *simulation) decoders(rep *replica, model string) []*fleet.Backend {
	if s.pd == nil {
		return rep.candidates(model) // mixed.go
	}
	return rep.backends[:s.pd.decoders]
}

// priceSplit gives f's pick the price of its way through the prefill pool
// when the splitter prices one, so that the policy chooses the decode
// server for the cheaper way in.
func (s *simulation) priceSplit(f *flight) {
	if s.pd == nil {
		return
	}
	if sp, ok := s.pd.splitter.(router.SplitPricer); ok {
		f.rreq.SplitTTFT = sp.SplitTTFT(&f.rreq, s.replicas[f.replica].backends[s.pd.decoders:])
	}
}

// prefillFirst asks the splitter whether f, routed to its decode server,
// is prefilled on a prefill server first; if so it queues the prefill leg
// there and reports true: f enters its decode server once the leg is done
// and its KV has moved (transferred).
func (s *simulation) prefillFirst(f *flight) bool {
	rep := s.replicas[f.replica]
	prefills := rep.backends[s.pd.decoders:]
	p := s.pd.splitter.Split(&f.rreq, &f.t.Decision, prefills, s.pd.rand.IntN)
	if p == nil {
		return false
	}
	leg := s.newFlight()
	leg.parent, leg.session, leg.replica, leg.sent = f, f.session, f.replica, s.now
	leg.req.PromptLen, leg.req.MaxTokens, leg.req.BlockHashes = f.req.PromptLen, 1, f.req.BlockHashes
	leg.rreq = f.rreq
	leg.rreq.MaxTokens = 1
	t, err := s.pd.prefillRouters[f.replica].Route(&leg.rreq, []*fleet.Backend{p})
	if err != nil {
		s.release(leg)
		return false
	}
	leg.t = t
	sv := &s.servers[p.Index]
	s.cut(p.Index)
	if err := sv.eng.Add(s.now, &leg.req); err != nil {
		t.Finish(router.Failed(http.StatusBadRequest))
		s.release(leg)
		return false // served whole, as the proxy falls back
	}
	s.pd.splits++
	if !sv.stepping {
		sv.stepping = true
		s.q.push(s.now, evStepStart, int32(p.Index))
	}
	return true
}

// prefilled ends prefill leg leg, whose one token came at s.now: its KV
// moves to the decode server, where its request arrives after the transfer.
func (s *simulation) prefilled(leg *flight) {
	leg.t.FirstToken()
	leg.t.Finish(router.Outcome{Status: http.StatusOK, PromptTokens: leg.req.PromptLen, CachedTokens: leg.req.CachedTokens,
		CompletionTokens: 1, TTFT: s.now - leg.sent, Latency: s.now - leg.sent, Tokens: 1})
	f := leg.parent
	f.req.RemoteTokens = f.req.PromptLen - 1
	transfer := time.Duration(float64(f.req.RemoteTokens) * s.pd.kvBytes / s.pd.link * float64(time.Second))
	s.pd.legs++
	s.q.push(s.now+transfer, evTransferred, int32(f.req.ID))
	s.release(leg)
}

// transferred queues flight id, its KV arrived, on its decode server.
func (s *simulation) transferred(id int32) {
	f := s.flights[id]
	i := f.t.Backend.Index
	sv := &s.servers[i]
	s.cut(i)
	if err := sv.eng.Add(s.now, &f.req); err != nil {
		s.fail(f, http.StatusBadRequest, fmt.Errorf("status 400: %w", err))
		return
	}
	if !sv.stepping {
		sv.stepping = true
		s.q.push(s.now, evStepStart, int32(i))
	}
}
