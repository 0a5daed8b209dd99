package proxy

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/jsonscan"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/sse"
)

// Migration: a stream whose backend fails after its first bytes reached
// the client continues on another backend, which is asked to continue the
// text sent so far (vLLM's continue_final_message for chat, prompt + text
// for completions); its events are spliced into the client's stream
// (splice.go). docs/operations.md, "Migration of a cut stream".

// Causes of a migration, the label of kvroute_migrations_total: how the
// stream's backend failed after its first bytes.
const (
	causeReset      = "reset"       // the connection broke (reset, closed before the end)
	causeIdle       = "idle"        // nothing came for the idle timeout
	causeErrorEvent = "error_event" // the backend sent an error event
	causeIncomplete = "incomplete"  // the stream ended with no finish_reason and no [DONE]
)

// Outcomes of a migration.
const (
	migrationContinued = "continued" // another backend took it on and its first token reached the client
	migrationFailed    = "failed"    // the backend tried failed before its first token
	migrationUnsafe    = "unsafe"    // what was sent cannot be continued (n > 1, logprobs, a tool call, ...)
	migrationLimit     = "limit"     // the request used its --max-migrations
	migrationNoBackend = "no_backend"
	migrationFinished  = "finished" // every token allowed was sent: kvroute ended the stream itself
)

var (
	migrationCauses   = []string{causeReset, causeIdle, causeErrorEvent, causeIncomplete}
	migrationOutcomes = []string{migrationContinued, migrationFinished, migrationFailed, migrationUnsafe, migrationLimit, migrationNoBackend}
)

// continuable reports whether a streamed request of kind ep could continue
// on another backend from what it sent so far, as far as its body tells:
// one choice (n, best_of), no logprobs (a continuation's would not line up
// with the first backend's), no echo, no structured output (the engine's
// grammar would start again where the text left off, as Dynamo's
// migration excludes guided decoding), and a completion prompt that is
// text.
func continuable(ep request.Endpoint, body []byte) bool {
	if ep != request.Chat && ep != request.Completion {
		return false
	}
	for m := range jsonscan.Members(body) {
		v := body[m.Val:m.End]
		switch {
		case m.Is("n"), m.Is("best_of"):
			if !jsonscan.IsNull(v) && jsonscan.IntValue(v) > 1 {
				return false
			}
		case m.Is("logprobs"), m.Is("top_logprobs"), m.Is("prompt_logprobs"):
			if !jsonscan.IsNull(v) && string(v) != "false" && string(v) != "0" {
				return false
			}
		case m.Is("echo"):
			if string(v) == "true" {
				return false
			}
		case m.Is("response_format"):
			if t := jsonscan.StringValue(jsonscan.Field(v, "type")); t != "" && t != "text" {
				return false
			}
		case m.Is("structured_outputs"), m.Is("guided_json"), m.Is("guided_regex"), m.Is("guided_choice"),
			m.Is("guided_grammar"), m.Is("grammar"), m.Is("json_schema"):
			if !jsonscan.IsNull(v) {
				return false
			}
		case m.Is("prompt"):
			if !jsonscan.IsString(v) && !oneString(v) {
				return false
			}
		}
	}
	return true
}

// oneString reports whether v is an array of one JSON string.
func oneString(v []byte) bool {
	n := 0
	for e := range jsonscan.Elems(v) {
		if !jsonscan.IsString(e) {
			return false
		}
		n++
	}
	return n == 1
}

// continuation returns the body that asks a backend to continue rec's text
// as the answer to the request body: for chat, the text as a final
// assistant message continued in place (continue_final_message, no
// generation prompt); for completions, the prompt followed by the text.
// max_tokens (and max_completion_tokens) shrink by the chunks sent; other
// settings, seed and sampling included, stay. ok is false when the body
// cannot be rewritten; spent is set, and out nil, when the text sent has
// all the tokens the request allowed.
func continuation(ep request.Endpoint, body []byte, rec *sse.Record) (out []byte, spent, ok bool) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return nil, false, false
	}
	for _, k := range []string{"max_tokens", "max_completion_tokens"} {
		raw, set := obj[k]
		if !set || jsonscan.IsNull(raw) {
			continue
		}
		left := jsonscan.IntValue(raw) - rec.Chunks
		if left < 1 {
			return nil, true, true
		}
		obj[k] = json.RawMessage(strconv.Itoa(left))
	}
	text, _ := json.Marshal(string(rec.Text))
	switch ep {
	case request.Chat:
		var msgs []json.RawMessage
		if json.Unmarshal(obj["messages"], &msgs) != nil {
			return nil, false, false
		}
		msgs = append(msgs, json.RawMessage(`{"role":"assistant","content":`+string(text)+`}`))
		obj["messages"], _ = json.Marshal(msgs)
		obj["continue_final_message"] = json.RawMessage("true")
		obj["add_generation_prompt"] = json.RawMessage("false")
	case request.Completion:
		var prompt string
		raw := obj["prompt"]
		if oneString(raw) {
			var one []string
			_ = json.Unmarshal(raw, &one)
			prompt = one[0]
		} else if json.Unmarshal(raw, &prompt) != nil {
			return nil, false, false
		}
		obj["prompt"], _ = json.Marshal(prompt + string(rec.Text))
	default:
		return nil, false, false
	}
	out, err := json.Marshal(obj)
	return out, false, err == nil
}

// rejectsContinuation reports whether a backend's status to a continuation
// says it cannot continue a message (an engine without
// continue_final_message, a model whose template refuses it): it is then
// not asked again for noContinueFor.
func rejectsContinuation(status int) bool {
	return status == http.StatusBadRequest || status == http.StatusNotFound || status == http.StatusUnprocessableEntity
}

// noContinueFor is how long a backend that refused a continuation is not
// asked for another: long enough that a fleet of engines without it does
// not pay a refusal per cut stream, short enough that an upgraded engine,
// or a refusal for another reason, is forgotten.
const noContinueFor = 10 * time.Minute

// refusesContinuation reports whether b refused a continuation lately.
func (p *Proxy) refusesContinuation(b *fleet.Backend) bool {
	at, ok := p.noContinue.Load(b)
	return ok && p.now().Sub(at.(time.Time)) < noContinueFor
}

// migrate carries c, whose stream at t's backend was cut (f) after its
// first bytes reached the client, on to other backends, each chosen by the
// router for the continuation among the candidates then (the fleet may
// have changed since the request came) less those that failed it, within
// the request's migrations; when it cannot, the stream ends with f's error
// event as before. It is one loop so that each migration's outcome is
// counted where its attempt ends.
func (p *Proxy) migrate(w http.ResponseWriter, r *http.Request, c *call, t *router.Ticket, f *failure, tried []*fleet.Backend) {
	cause, cutAt := f.cause, f.at
	for {
		tried = append(tried, t.Backend)
		cands := slices.DeleteFunc(p.fleet.Candidates(nil, c.req.Model), func(b *fleet.Backend) bool {
			return slices.Contains(tried, b)
		})
		outcome, next := p.nextContinuation(r, c, cands)
		if outcome == migrationFinished {
			p.metrics.migrations.WithLabelValues(cause, outcome).Inc()
			p.finishSpent(w, c)
			return
		}
		if next == nil {
			p.metrics.migrations.WithLabelValues(cause, outcome).Inc()
			p.log.Warn("stream cut, not continued elsewhere", "request_id", c.id, "backend", t.Backend.Name, "cause", cause, "why", outcome)
			p.endCut(w, f)
			return
		}
		c.migrations++
		if c.splice == nil {
			c.splice = &splice{now: p.now}
		}
		c.splice.start(w, c.rec)
		p.metrics.reprefilled.Add(float64(c.req.PromptTokens))
		f2, _ := p.attempt(w, r, c, next, true)
		if c.splice.firstAt.IsZero() {
			// Nothing of the continuation reached the client: try another.
			p.metrics.migrations.WithLabelValues(cause, migrationFailed).Inc()
			if f2 == nil { // the client left, or kvroute is stopping
				p.endCut(w, f)
				return
			}
			if f2.kind == "status" && rejectsContinuation(f2.status) {
				p.noContinue.Store(next.Backend, p.now())
			}
			t = next
			continue
		}
		p.metrics.migrations.WithLabelValues(cause, migrationContinued).Inc()
		p.metrics.migrationGap.Observe(c.splice.firstAt.Sub(cutAt).Seconds())
		p.log.Info("stream continued on another backend", "request_id", c.id, "from", t.Backend.Name, "to", next.Backend.Name,
			"cause", cause, "sent_tokens", c.splice.sent, "gap", c.splice.firstAt.Sub(cutAt))
		if f2 == nil || !f2.cut {
			return
		}
		t, f, cause, cutAt = next, f2, f2.cause, f2.at
	}
}

// nextContinuation readies c to continue on one of cands and routes it:
// the continuation's body and facts in c, its ticket returned; or nil and
// why not.
func (p *Proxy) nextContinuation(r *http.Request, c *call, cands []*fleet.Backend) (string, *router.Ticket) {
	switch {
	case c.rec.Other:
		return migrationUnsafe, nil
	case c.migrations >= p.res.MaxMigrations:
		return migrationLimit, nil
	}
	body, spent, ok := continuation(c.ep, c.body, c.rec)
	switch {
	case spent:
		return migrationFinished, nil
	case !ok:
		return migrationUnsafe, nil
	}
	g, e := request.Parse(c.ep, body, c.req.SessionKey)
	if e != nil {
		return migrationUnsafe, nil
	}
	g.Request.Body = body
	p.router.Estimate(&g.Request)
	live := make([]*fleet.Backend, 0, len(cands))
	for _, b := range cands {
		if !p.refusesContinuation(b) {
			live = append(live, b)
		}
	}
	if len(live) == 0 {
		return migrationNoBackend, nil
	}
	c.body, c.req, c.retrying = body, &g.Request, false
	c.rec.Failed = nil
	t, err := p.tracedRoute(r.Context(), c, live) // tracing.go: p.route in a span
	if err != nil {
		return migrationNoBackend, nil
	}
	return "", t
}

// finishSpent ends a stream cut after its last allowed token and before
// its finish: with the chunk a backend would have sent, finish_reason
// "length", and [DONE]. It has no usage to give: the backend's never came.
func (p *Proxy) finishSpent(w http.ResponseWriter, c *call) {
	ev := append([]byte(`data: {"id":`), c.rec.ID...)
	if c.ep == request.Chat {
		ev = append(ev, `,"object":"chat.completion.chunk","created":`...)
	} else {
		ev = append(ev, `,"object":"text_completion","created":`...)
	}
	ev = append(append(ev, c.rec.Created...), `,"model":`...)
	ev = append(append(ev, c.rec.Model...), `,"choices":[{"index":0,`...)
	if c.ep == request.Chat {
		ev = append(ev, `"delta":{}`...)
	} else {
		ev = append(ev, `"text":""`...)
	}
	ev = append(ev, `,"logprobs":null,"finish_reason":"length"}]}`+"\n\ndata: [DONE]\n\n"...)
	if _, err := w.Write(ev); err == nil {
		_ = sse.Flush(sse.FlusherOf(w))
	}
}

// endCut ends a stream cut after its first bytes with f's error event and
// [DONE], as vLLM ends a stream that fails: the client sees why.
func (p *Proxy) endCut(w http.ResponseWriter, f *failure) {
	if _, err := w.Write(f.event); err == nil {
		_ = sse.Flush(sse.FlusherOf(w))
	}
}
