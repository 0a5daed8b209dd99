package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/sse"
)

// serveGeneration serves a chat, completion or Responses API request:
// parse, route by the policy, forward.
func (p *Proxy) serveGeneration(w http.ResponseWriter, r *http.Request, ep request.Endpoint) {
	body, e := p.readBody(w, r)
	if e != nil {
		p.reject(w, e)
		return
	}
	g, e := request.Parse(ep, body, r.Header.Get(p.sessionHeader))
	if e != nil {
		p.reject(w, e)
		return
	}
	g.Request.Body = body // for a policy that has the backend tokenize it
	// One estimate of the prompt's tokens for the rate limit, admission,
	// the policy and the load accounting.
	p.router.Estimate(&g.Request)
	if e := p.chargeTokens(w, r, &g.Request); e != nil { // security.go: tokens per minute
		p.rejectFor(w, e, g.Request.Model)
		return
	}
	entry, e := p.entry(r, &g.Request)
	if e != nil {
		p.rejectFor(w, e, g.Request.Model)
		return
	}
	c := &call{ep: ep, req: &g.Request, body: body, stream: g.Stream, deadline: entry.Deadline, model: g.Request.Model}
	if g.Stream && !g.IncludeUsage && ep != request.Responses && ep != request.Messages {
		// Ask for the usage chunk so that the router learns what the
		// backend had cached; the client will not see it. (A Responses
		// API stream always ends with its usage, in response.completed,
		// and a Messages API stream in message_start and message_delta.)
		c.body, c.hideUsage = request.WithIncludeUsage(body)
	}
	if ep == request.Responses {
		c.ids, c.body = p.responsesCall(c.body, g.Request.PreviousResponseID) // responseid.go
	}
	if g.Stream && p.res.MaxMigrations > 0 && continuable(ep, body) {
		c.rec = sse.NewRecord() // migrate.go: its stream may continue elsewhere
	}
	cands, e := p.candidates(w, g.Request.Model)
	if e != nil {
		p.rejectFor(w, e, g.Request.Model)
		return
	}
	cands = withRoles(c, cands) // disagg.go: prefill servers apart
	cands, release, ok := p.admitGeneration(w, r, entry, cands, g.Request.Model)
	if !ok {
		return
	}
	defer release()
	p.forward(w, r, c, cands)
}

// serveByLoad serves embeddings and the other /v1 endpoints: routed to the
// least loaded healthy backend that serves the body's model. Embeddings must
// name a model; other endpoints fall back to any healthy backend.
func (p *Proxy) serveByLoad(w http.ResponseWriter, r *http.Request, ep request.Endpoint) {
	body, e := p.readBody(w, r)
	if e != nil {
		p.reject(w, e)
		return
	}
	var cands []*fleet.Backend
	var ids *responseIDs
	model := "" // the model label: a model the candidates serve
	if ep == request.Embedding {
		if model, e = request.RequireModel(body); e != nil {
			p.reject(w, e)
			return
		}
		if cands, e = p.candidates(w, model); e != nil {
			p.rejectFor(w, e, model)
			return
		}
	} else {
		if model = request.Model(body); model != "" {
			cands = p.fleet.Candidates(nil, model)
		}
		if len(cands) == 0 {
			model = ""
			cands = p.fleet.Healthy(nil)
		}
		if len(cands) == 0 {
			p.reject(w, openai.Unavailable("no healthy backend"))
			return
		}
		// A stored response (an operator allowed /v1/responses/) is known
		// only to the backend that produced it, by its own id.
		if id := request.StoredResponseID(r.URL.Path); id != "" {
			if b := p.router.ResponseBackend(id, cands); b != nil {
				cands = []*fleet.Backend{b}
			}
			r, ids = storedResponseRequest(r, id) // responseid.go
		}
	}
	p.forward(w, r, &call{ep: ep, body: body, model: model, ids: ids}, cands)
}

// candidates returns the healthy backends that serve model, appended to dst,
// or the error that explains why there are none: no backend serves the
// model (404), or those that do are all down, or the fleet is not ready yet
// (503).
func (p *Proxy) candidates(w http.ResponseWriter, model string) ([]*fleet.Backend, *apiError) {
	cands := p.fleet.Candidates(nil, model)
	if len(cands) > 0 {
		return cands, nil
	}
	if len(p.fleet.Backends()) > 0 {
		// A health check's round may bring one back.
		w.Header().Set("Retry-After", waitRetry)
	}
	for _, b := range p.fleet.Backends() {
		if b.Info().Serves(model) {
			return nil, openai.Unavailable("no healthy backend serves the model `%s`", model)
		}
	}
	if !p.fleet.Ready() {
		return nil, openai.Unavailable("no backend is ready")
	}
	return nil, openai.ModelNotFound(model)
}

// serveModels answers GET /v1/models with the models the fleet serves.
func (p *Proxy) serveModels(w http.ResponseWriter) {
	models := slices.Clone(p.fleet.Models())
	slices.Sort(models)
	models = slices.Compact(models)
	b := make([]byte, 0, 64+80*len(models))
	b = append(b, `{"object":"list","data":[`...)
	for i, m := range models {
		if i > 0 {
			b = append(b, ',')
		}
		id, _ := json.Marshal(m) // a string: cannot fail
		b = append(b, `{"id":`...)
		b = append(b, id...)
		b = append(b, `,"object":"model","created":`...)
		b = strconv.AppendInt(b, p.created, 10)
		b = append(b, `,"owned_by":"kvroute"}`...)
	}
	b = append(b, "]}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// maxPrealloc bounds the buffer allocated for a request body before its
// bytes arrive.
const maxPrealloc = 1 << 20

// readBody reads r's body, at most p.maxBody bytes.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	if r.ContentLength > p.maxBody {
		return nil, openai.TooLarge(p.maxBody)
	}
	// Size the buffer by the declared length, but only up to a bound: a
	// client that declares 32 MiB and sends nothing must not cost 32 MiB.
	size := r.ContentLength
	if size < 0 || size > maxPrealloc {
		size = min(maxPrealloc, p.maxBody)
	}
	// A body sent a byte a second must not hold a connection for ever. The
	// deadline is lifted once the body is in (a response may stream for
	// minutes), and kept when it is not: the connection is then closed
	// after the answer rather than read on.
	deadline := p.res.BodyReadTimeout > 0 && setReadDeadline(w, time.Now().Add(p.res.BodyReadTimeout)) == nil
	// A byte of room past the declared length reads the end without
	// growing the buffer.
	body, err := readAll(make([]byte, 0, size+1), http.MaxBytesReader(w, r.Body, p.maxBody))
	if err == nil && deadline {
		_ = setReadDeadline(w, time.Time{})
	}
	if err != nil {
		w.Header().Set("Connection", "close")
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, openai.TooLarge(p.maxBody)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, &apiError{Status: http.StatusRequestTimeout, Type: typeInvalidRequest, Code: codeRequestTimeout,
				Message: fmt.Sprintf("the request body did not arrive within %v", p.res.BodyReadTimeout)}
		}
		return nil, openai.BadRequest("", "could not read request body: %v", err)
	}
	return body, nil
}

// readAll appends what r reads to b until r's end, growing b only when it
// is full: io.ReadAll with the first buffer given.
func readAll(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// setReadDeadline is http.ResponseController's, without its allocation when
// w is net/http's own writer, as it is for every request without tracing.
func setReadDeadline(w http.ResponseWriter, t time.Time) error {
	if d, ok := w.(interface{ SetReadDeadline(time.Time) error }); ok {
		return d.SetReadDeadline(t)
	}
	return http.NewResponseController(w).SetReadDeadline(t)
}

// allow reports whether r's method is one of methods, answering 405 with an
// Allow header if not.
func (p *Proxy) allow(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	if slices.Contains(methods, r.Method) {
		return true
	}
	allowed := strings.Join(methods, ", ")
	w.Header().Set("Allow", allowed)
	p.reject(w, &apiError{
		Status:  http.StatusMethodNotAllowed,
		Message: "Method " + r.Method + " is not allowed on " + r.URL.Path + "; use " + allowed,
		Type:    typeInvalidRequest,
		Code:    codeMethodNotAllowed,
	})
	return false
}
