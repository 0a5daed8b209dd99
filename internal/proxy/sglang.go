package proxy

import (
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/upstream"
)

// withBootstrap returns body with SGLang's disaggregation fields: the
// prefill server's host and bootstrap port, and the room both legs meet in.
func withBootstrap(body []byte, host string, port int, room uint64) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	h, _ := json.Marshal(host)
	m["bootstrap_host"] = h
	m["bootstrap_port"] = json.RawMessage(strconv.Itoa(port))
	m["bootstrap_room"] = json.RawMessage(strconv.FormatUint(room, 10))
	return json.Marshal(m)
}

// concurrentLegs splits c SGLang's way through prefill server b: both legs
// carry the same bootstrap room, the prefill leg is sent now and runs
// beside the decode's attempt, whose answer is the client's. c.whole keeps
// the body without the room: a retried attempt is served whole, since the
// room was the first decode server's. It reports false, changing nothing,
// when the body cannot take the fields.
func (p *Proxy) concurrentLegs(r *http.Request, c *call, b *fleet.Backend) bool {
	room := rand.Uint64() >> 1 // SGLang's rooms are non-negative 63-bit integers
	body, err := withBootstrap(c.body, b.URL.Hostname(), b.BootstrapPort(), room)
	if err != nil {
		return false
	}
	leg, err := prefillLeg(body, false)
	if err != nil {
		return false
	}
	preq := *c.req
	preq.MaxTokens = 1
	t, err := p.prefillRouter.Route(&preq, []*fleet.Backend{b})
	if err != nil {
		return false
	}
	c.whole, c.body = c.body, body
	ctx, cancel := context.WithTimeout(r.Context(), p.disagg.PrefillTimeout)
	req := p.withCredentials(upstream.NewRequest(ctx, r, b.URL, leg), b)
	req.Header.Set(HeaderRequestID, c.id)
	go func() {
		defer cancel()
		p.dmetrics.legs.WithLabelValues(b.Name, p.sendLeg(req, b, t)).Inc()
	}()
	return true
}

// sendLeg sends a concurrent prefill leg and reads its answer to the end,
// finishing its ticket; it returns the leg's outcome.
func (p *Proxy) sendLeg(req *http.Request, b *fleet.Backend, t *router.Ticket) string {
	out := router.Failed(0)
	defer func() { t.Finish(out) }()
	start := p.now()
	res, err := p.transport.RoundTrip(req)
	switch {
	case err != nil && isDialError(err):
		p.fleet.MarkFailed(b, err)
		return "dial"
	case err != nil:
		return "reset"
	}
	defer res.Body.Close()
	out.Status = res.StatusCode
	if _, err := io.Copy(io.Discard, io.LimitReader(res.Body, maxPrefillAnswer)); err != nil {
		return "reset"
	}
	if r, ok := fleet.ResultOf(res.StatusCode, true, 0, 0); ok {
		p.fleet.Report(b, r)
	}
	if res.StatusCode/100 != 2 {
		return "status"
	}
	t.FirstToken()
	p.dmetrics.legTime.Observe(p.now().Sub(start).Seconds())
	return "ok"
}
