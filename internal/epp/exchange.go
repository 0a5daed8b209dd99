package epp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/router"
)

// exchange is one stream's state: one request and its response, handled on
// the stream's own goroutine (Ticket's contract).
type exchange struct {
	p   *Picker
	srv extprocv3.ExternalProcessor_ProcessServer
	ctx context.Context

	// The request.
	method, path string
	header       map[string]string // lower-case names; the last value of each
	subset       map[string]bool   // the endpoints Envoy allows (ip:port, or ip for all its ports); nil: all
	body         []byte
	replied      bool // the request headers' reply has been sent

	// The routing, once decided.
	t        *router.Ticket
	release  func() // the admission slot
	start    time.Time
	stream   bool
	finished bool
	// The prefill/decode split (disagg.go): the prefill endpoints, the one
	// chosen (ip:port, "" for none) and its leg's count.
	prefills []*fleet.Backend
	prefill  string
	pt       *router.Ticket

	// The response.
	status int
	watch  *watcher
	first  bool
	ttft   time.Duration

	// ids maps Responses API ids between the endpoint and the client
	// (responseid.go); nil for other requests. newPath, when set, is the
	// request's new :path (a stored response's, with the endpoint's id).
	ids     *idMap
	newPath string
}

// handle answers one message from Envoy; done means the stream is over for
// the picker (it sent an immediate response).
func (x *exchange) handle(req *extprocv3.ProcessingRequest) (done bool, err error) {
	switch v := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		x.requestHeaders(v.RequestHeaders.GetHeaders(), req.GetMetadataContext())
		if v.RequestHeaders.GetEndOfStream() {
			return x.decide(false, true)
		}
	case *extprocv3.ProcessingRequest_RequestBody:
		b := v.RequestBody
		if int64(len(x.body)+len(b.GetBody())) > x.p.opts.MaxBodyBytes {
			e := &openai.Error{Status: http.StatusRequestEntityTooLarge, Type: openai.TypeInvalidRequest,
				Message: fmt.Sprintf("request body is larger than %d bytes", x.p.opts.MaxBodyBytes)}
			return true, x.refuse(e, "", "too_large")
		}
		x.body = append(x.body, b.GetBody()...)
		if b.GetEndOfStream() {
			return x.decide(true, true)
		}
	case *extprocv3.ProcessingRequest_RequestTrailers:
		// Trailers end a body that had no end_of_stream chunk.
		if !x.replied {
			if done, err := x.decide(true, false); done || err != nil {
				return done, err
			}
		}
		return false, x.srv.Send(passTrailers(false))
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		x.responseHeaders(v.ResponseHeaders.GetHeaders(), req.GetMetadataContext())
		reply := passHeaders(true)
		if x.ids != nil && x.ids.started {
			reply = dropLength() // the ids rewritten change the body's length
		}
		if err := x.srv.Send(reply); err != nil {
			return false, err
		}
		if v.ResponseHeaders.GetEndOfStream() {
			x.finish(true)
		}
	case *extprocv3.ProcessingRequest_ResponseBody:
		b := v.ResponseBody
		if x.watch == nil {
			x.watch = newWatcher(false)
			x.watch.responses, x.watch.messages = x.path == "/v1/responses", isMessages(x.path)
		}
		if x.watch.feed(b.GetBody()) && !x.first {
			x.first = true
			x.ttft = x.p.now().Sub(x.start)
			if x.t != nil {
				x.t.FirstToken()
			}
			x.endPrefill() // disagg.go
		}
		// Echo before finishing: the client's bytes come first.
		out := b.GetBody()
		if x.ids != nil && x.ids.started {
			out = x.ids.feed(x.watch, out, b.GetEndOfStream())
		}
		if len(out) > 0 || b.GetEndOfStream() {
			if err := x.srv.Send(bodyChunk(true, out, b.GetEndOfStream())); err != nil {
				return false, err
			}
		}
		if b.GetEndOfStream() {
			x.finish(true)
		}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		x.finish(true)
		if x.ids != nil && x.ids.started {
			// Trailers end the body: what was held back goes first.
			if out := x.ids.feed(x.watch, nil, true); len(out) > 0 {
				if err := x.srv.Send(bodyChunk(true, out, false)); err != nil {
					return false, err
				}
			}
		}
		return false, x.srv.Send(passTrailers(true))
	}
	return false, nil
}

// requestHeaders notes what routing needs from the request's headers and
// its metadata: path, method, session, priority, the allowed subset.
func (x *exchange) requestHeaders(h *corev3.HeaderMap, md *corev3.Metadata) {
	x.header = headerMap(h)
	x.method = x.header[":method"]
	x.path, _, _ = strings.Cut(x.header[":path"], "?")
	if ns := md.GetFilterMetadata()[SubsetNamespace]; ns != nil {
		if v, ok := ns.GetFields()[KeySubset]; ok {
			x.subset = map[string]bool{}
			// A list of strings, or one comma-separated string (GIE's
			// lwepp accepts both, as proxies write either).
			var items []string
			if l := v.GetListValue(); l != nil {
				for _, e := range l.GetValues() {
					items = append(items, e.GetStringValue())
				}
			} else {
				items = []string{v.GetStringValue()}
			}
			for _, it := range items {
				for a := range strings.SplitSeq(it, ",") {
					if a = strings.TrimSpace(a); a != "" {
						x.subset[a] = true
					}
				}
			}
		}
	}
}

// headerMap returns h's headers by lower-case name; Envoy sends values in
// raw_value (value when an older one does not).
func headerMap(h *corev3.HeaderMap) map[string]string {
	m := make(map[string]string, len(h.GetHeaders()))
	for _, hv := range h.GetHeaders() {
		v := hv.GetValue()
		if raw := hv.GetRawValue(); len(raw) > 0 {
			v = string(raw)
		}
		m[strings.ToLower(hv.GetKey())] = v
	}
	return m
}

// generation reports whether the request is one the policy routes: a chat,
// completion, Responses API or Messages API POST with a body.
func (x *exchange) generation(hasBody bool) bool {
	return hasBody && x.method == http.MethodPost &&
		(x.path == "/v1/chat/completions" || x.path == "/v1/completions" || x.path == "/v1/responses" || x.path == "/v1/messages")
}

// candidates returns the endpoints in rotation that serve model ("": any),
// within the subset Envoy allows.
func (x *exchange) candidates(model string) []*fleet.Backend {
	var cands []*fleet.Backend
	if model == "" {
		cands = x.p.fleet.Healthy(nil)
	} else {
		cands = x.p.fleet.Candidates(nil, model)
	}
	if x.subset != nil {
		cands = slices.DeleteFunc(cands, func(b *fleet.Backend) bool { return !x.allowed(b) })
	}
	return cands
}

// allowed reports whether the subset Envoy sent admits b: its ip:port, or
// its IP alone, which admits every port of that IP (the data-parallel
// ranks of one pod; GIE lwepp reads an entry without a port so).
func (x *exchange) allowed(b *fleet.Backend) bool {
	a := Address(b)
	if x.subset[a] {
		return true
	}
	host, _, err := net.SplitHostPort(a)
	return err == nil && x.subset[host]
}

// decide routes the request once its body is complete (hasBody: it has
// one; eos: the body ended with end_of_stream rather than trailers) and
// sends the header reply and the body back, or an immediate response.
func (x *exchange) decide(hasBody, eos bool) (done bool, err error) {
	if !x.generation(hasBody) {
		return x.decideByLoad(hasBody, eos)
	}
	g, e := request.ParseGeneration(x.path, x.body, x.header[strings.ToLower(x.p.opts.SessionHeader)])
	if e != nil {
		return true, x.refuse(e, "", "bad_request")
	}
	req := &g.Request
	x.p.router.Estimate(req)
	cands := x.withRoles(x.candidates(req.Model)) // disagg.go
	if len(cands) == 0 {
		return true, x.refuse(noEndpoint("no endpoint in rotation serves model %q", req.Model), "1", "no_endpoint")
	}
	class, err := admission.ParseClass(x.header[strings.ToLower(admission.HeaderPriority)])
	if err != nil {
		return true, x.refuse(&openai.Error{Status: http.StatusBadRequest, Type: openai.TypeInvalidRequest,
			Message: fmt.Sprintf("header %s: %v", admission.HeaderPriority, err)}, "", "bad_request")
	}
	entry := admission.Entry{Class: class, Tokens: int64(req.PromptTokens + max(req.MaxTokens, 0)),
		Tenant: cmp.Or(x.header[strings.ToLower(admission.HeaderTenant)], x.header[HeaderFairnessID])}
	release, err := x.p.queue.Acquire(x.ctx, entry, func() bool { return x.p.roomOn(cands) })
	if err != nil {
		if rej, ok := errors.AsType[*admission.Rejection](err); ok {
			x.p.log.Info("request refused", "reason", rej.Err, "class", class, "tenant", entry.Tenant, "retry_after", rej.RetryAfter)
			return true, x.refuse(rej.OpenAI(), strconv.Itoa(rej.RetryAfterSeconds()), "refused")
		}
		return true, err // the stream ended while queued
	}
	room := slices.DeleteFunc(slices.Clone(cands), func(b *fleet.Backend) bool { return !x.p.hasRoom(b) })
	if len(room) == 0 {
		room = cands // counts moved since canRun: the policy's bound decides
	}
	x.priceSplit(req) // disagg.go
	t0 := x.p.now()
	t, err := x.p.router.Route(req, room)
	x.p.metrics.decision.Observe(x.p.now().Sub(t0).Seconds())
	if err != nil {
		release()
		if errors.Is(err, router.ErrNoBackend) {
			return true, x.refuse(noEndpoint("no endpoint can take the request: %v", err), "1", "no_endpoint")
		}
		// Not a local reply but a gRPC error: Envoy then applies the
		// pool's failure mode (failure_mode_allow), so a FailOpen pool
		// still serves the request; a FailClose one answers 500.
		x.p.metrics.requests.WithLabelValues("error").Inc()
		return true, status.Errorf(codes.Internal, "routing policy %s failed: %v", x.p.router.Name(), err)
	}
	x.t, x.release, x.start, x.stream = t, release, t0, g.Stream
	x.split(req, t) // disagg.go
	body := x.body
	// A Responses API stream ends with its usage (response.completed), a
	// Messages API stream has it in message_start and message_delta; neither
	// has stream_options.
	if g.Stream && !g.IncludeUsage && x.p.opts.IncludeUsage && x.path != "/v1/responses" && x.path != "/v1/messages" {
		body, _ = request.WithIncludeUsage(body)
	}
	if x.path == "/v1/responses" {
		x.ids, body = responsesRequest(x.p.router, body, req.PreviousResponseID) // responseid.go
	}
	list := x.p.destinations(t.Decision, room)
	x.p.metrics.requests.WithLabelValues("routed").Inc()
	return false, x.reply(list, body, true, eos)
}

// decideByLoad sends a request the policy does not route (no body, or not
// a generation) to the least loaded endpoint in rotation that serves its
// model, if it names one; nothing is counted or learned.
func (x *exchange) decideByLoad(hasBody, eos bool) (bool, error) {
	model := ""
	if hasBody {
		if g, e := request.ParseGeneration("/v1/completions", x.body, ""); e == nil {
			model = g.Request.Model
		}
	}
	cands := x.candidates(model)
	// A stored response (GET /v1/responses/{id}, its cancel, its input
	// items) is known only to the endpoint that produced it.
	if id := request.StoredResponseID(x.path); id != "" {
		x.newPath, x.ids = storedResponsePath(x.header[":path"], id) // responseid.go
		if b := x.p.router.ResponseBackend(id, cands); b != nil {
			x.p.metrics.requests.WithLabelValues("by_response").Inc()
			return false, x.reply([]string{Address(b)}, x.body, hasBody, eos)
		}
	}
	b := router.LeastLoaded(cands, intN)
	if b == nil {
		return true, x.refuse(noEndpoint("no endpoint in rotation"), "1", "no_endpoint")
	}
	x.p.metrics.requests.WithLabelValues("by_load").Inc()
	return false, x.reply([]string{Address(b)}, x.body, hasBody, eos)
}

// reply sends the header reply naming the destinations, then the body back
// in chunks (the protocol's order: never a body reply before the header
// reply).
func (x *exchange) reply(list []string, body []byte, hasBody, eos bool) error {
	// The protocol: the header and the metadata carry the same value.
	header := strings.Join(list, ",")
	if x.p.opts.OriginalDstHeader {
		header = list[0]
	}
	x.replied = true
	if err := x.srv.Send(x.withPrefiller(destinationReply(header, list, len(body), hasBody, x.newPath))); err != nil { // disagg.go
		return err
	}
	if !hasBody {
		return nil
	}
	for _, m := range bodyChunks(false, body, eos) {
		if err := x.srv.Send(m); err != nil {
			return err
		}
	}
	x.body = nil
	return nil
}

// refuse sends an immediate response: Envoy answers the client with it and
// sends the request nowhere.
func (x *exchange) refuse(e *openai.Error, retryAfter, label string) error {
	x.p.metrics.requests.WithLabelValues(label).Inc()
	x.replied = true
	return x.srv.Send(immediate(e, retryAfter, isMessages(x.path)))
}

func noEndpoint(format string, args ...any) *openai.Error {
	return &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeServer,
		Code: "no_endpoint", Message: fmt.Sprintf(format, args...)}
}

// responseHeaders notes the status, whether the body streams, and which
// endpoint Envoy says served the request: when it is not the chosen one
// (Envoy fell back), the chosen one failed and the ticket ends with that.
func (x *exchange) responseHeaders(h *corev3.HeaderMap, md *corev3.Metadata) {
	hm := headerMap(h)
	x.status, _ = strconv.Atoi(hm[":status"])
	x.watch = newWatcher(strings.Contains(hm["content-type"], "text/event-stream"))
	x.watch.responses, x.watch.messages = x.path == "/v1/responses", isMessages(x.path)
	served := md.GetFilterMetadata()[MetadataNamespace].GetFields()[KeyServed].GetStringValue()
	if x.ids != nil && x.status/100 == 2 {
		x.ids.start(x.p.router, x.servedBy(served), x.watch.sse) // responseid.go
	}
	if x.t == nil || served == "" || served == Address(x.t.Backend) {
		return
	}
	x.p.metrics.requests.WithLabelValues("served_by_fallback").Inc()
	x.p.fleet.Report(x.t.Backend, fleet.Result{Kind: fleet.ResultGatewayError})
	x.t.Finish(router.Failed(0))
	x.t = nil
	x.done()
}

// servedBy returns the endpoint Envoy says served the request (served, its
// address; "": the chosen one), or nil if it is none of the fleet's.
func (x *exchange) servedBy(served string) *fleet.Backend {
	if x.t != nil && (served == "" || served == Address(x.t.Backend)) {
		return x.t.Backend
	}
	for _, b := range x.p.fleet.Backends() {
		if served != "" && Address(b) == served {
			return b
		}
	}
	return nil
}

// finish ends the ticket with the response's outcome: ok when the response
// ended as it should (end_of_stream or trailers), a failure otherwise.
func (x *exchange) finish(ok bool) {
	if x.t == nil || x.finished {
		return
	}
	x.finished = true
	p, t := x.p, x.t
	o := router.Failed(x.status)
	complete := ok && x.status != 0
	if complete {
		o = router.Outcome{Status: x.status, PromptTokens: -1, CachedTokens: -1, CompletionTokens: -1}
		if w := x.watch; w != nil {
			w.end()
			o.PromptTokens, o.CachedTokens, o.CompletionTokens = w.prompt, w.cached, w.completion
			o.ResponseID = w.responseID
			if w.sse {
				o.Tokens = w.tokens
			}
		}
		if x.first {
			o.TTFT = x.ttft
		}
	}
	o.Latency = p.now().Sub(x.start)
	p.report(t, o, complete, x.stream && x.first)
	t.Finish(o)
	if o.CachedTokens >= 0 && o.PromptTokens > 0 {
		p.metrics.prompt.Add(float64(o.PromptTokens))
		p.metrics.cached.Add(float64(o.CachedTokens))
	}
	x.done()
}

// done gives the admission slot back.
func (x *exchange) done() {
	x.endPrefill() // disagg.go
	if x.release != nil {
		x.release()
		x.release = nil
	}
}

// abandon ends what the stream leaves unfinished: Envoy closed it (the
// client went away, the upstream reset) before the response's end.
func (x *exchange) abandon() {
	if x.t != nil && !x.finished {
		x.p.metrics.requests.WithLabelValues("cut").Inc()
	}
	x.finish(false)
	x.done()
}

// report tells the fleet how the attempt went, for outlier ejection,
// classified as the proxy classifies its answers (fleet.ResultOf); a stream
// cut without a status says nothing about the endpoint (the client may have
// left).
func (p *Picker) report(t *router.Ticket, o router.Outcome, complete, timed bool) {
	var ttft, predicted time.Duration
	if timed {
		ttft, predicted = o.TTFT, t.PredictedTTFT
	}
	if r, ok := fleet.ResultOf(o.Status, complete, ttft, predicted); ok {
		p.fleet.Report(t.Backend, r)
	}
}

// hasRoom reports whether b is below the per-endpoint cap.
func (p *Picker) hasRoom(b *fleet.Backend) bool {
	return p.opts.MaxPerEndpoint < 0 || b.Load().Requests < int64(p.opts.MaxPerEndpoint)
}

// roomOn reports whether some candidate is below the per-endpoint cap.
func (p *Picker) roomOn(cands []*fleet.Backend) bool {
	return slices.ContainsFunc(cands, p.hasRoom)
}

// destinations returns the ordered destination list: the chosen endpoint,
// then up to Fallbacks others among cands, next-best first. A scoring
// policy's scores order them (cheapest first); for the others, the least
// loaded go first.
func (p *Picker) destinations(d router.Decision, cands []*fleet.Backend) []string {
	list := []string{Address(d.Backend)}
	if p.opts.Fallbacks <= 0 {
		return list
	}
	others := slices.DeleteFunc(slices.Clone(cands), func(b *fleet.Backend) bool { return b == d.Backend })
	rank := make(map[*fleet.Backend]float64, len(others))
	if d.Scores != nil {
		byName := make(map[string]float64, len(d.Scores))
		for _, s := range d.Scores {
			byName[s.Backend] = s.Cost
		}
		for _, b := range others {
			c, ok := byName[b.Name]
			if !ok {
				c = inf // not among the explained: after those that are
			}
			rank[b] = c
		}
	} else {
		for _, b := range others {
			rank[b] = float64(b.Load().Requests)
		}
	}
	slices.SortStableFunc(others, func(a, b *fleet.Backend) int { return cmp.Compare(rank[a], rank[b]) })
	for _, b := range others[:min(len(others), p.opts.Fallbacks)] {
		list = append(list, Address(b))
	}
	return list
}

const inf = 1e300
