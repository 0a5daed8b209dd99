package emulator

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
)

// bootstrap is SGLang's disaggregation fields of a request: the prefill
// server's host and bootstrap port, and the room its prefill and decode
// legs meet in. The emulator serves the bootstrap rendezvous on its HTTP
// port (bootstrapPath), so a router names that port as the bootstrap port.
type bootstrap struct {
	Host *string `json:"bootstrap_host"`
	Port *int    `json:"bootstrap_port"`
	Room *uint64 `json:"bootstrap_room"`
}

// DefaultBootstrapTimeout bounds a decode server's wait for its room's
// prefill: past it the decode answers 503 (SGLang aborts the request).
const DefaultBootstrapTimeout = 30 * time.Second

// bootstrapPath is where a prefill emulator answers a decode emulator's
// wait for a room: GET bootstrapPath + room.
const bootstrapPath = "/kvroute/bootstrap/"

// room is one bootstrap room on a prefill server: done is closed once its
// prefill finished, with the prompt's key and length.
type room struct {
	done    chan struct{}
	prompt  uint64
	tokens  int
	created time.Time
}

// room returns room id, made on first use by either leg.
func (s *Server) room(id uint64) *room {
	p := s.pd
	now := s.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rooms == nil {
		p.rooms = make(map[uint64]*room)
	}
	for k, r := range p.rooms { // rooms no leg came back for
		if now.Sub(r.created) > p.cfg.Hold {
			delete(p.rooms, k)
		}
	}
	r := p.rooms[id]
	if r == nil {
		r = &room{done: make(chan struct{}), created: now}
		p.rooms[id] = r
	}
	return r
}

// roomDone tells the decode waiting in b's room that c's prefill is done.
func (s *Server) roomDone(c *call, b *bootstrap) {
	if b == nil || b.Room == nil || !s.pd.producer() {
		return
	}
	r := s.room(*b.Room)
	s.pd.mu.Lock()
	defer s.pd.mu.Unlock()
	select {
	case <-r.done:
	default:
		r.prompt, r.tokens = promptKey(c, s.profile.BlockSize), c.req.PromptLen
		close(r.done)
	}
}

// handleBootstrap answers a decode server's wait for a room's prefill,
// once the prefill is done (or the wait ends first: 504).
func (s *Server) handleBootstrap(w http.ResponseWriter, r *http.Request, id string) {
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil || !s.pd.producer() {
		s.notFound(w, r)
		return
	}
	rm := s.room(n)
	// A wait on the network, in wall time like the decode's own bound.
	timer := time.NewTimer(s.pd.cfg.BootstrapTimeout)
	defer timer.Stop()
	select {
	case <-rm.done:
	case <-r.Context().Done():
		return
	case <-timer.C:
		http.Error(w, "room not prefilled in time", http.StatusGatewayTimeout)
		return
	}
	s.pd.mu.Lock()
	delete(s.pd.rooms, n)
	s.pd.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"tokens": rm.tokens, "prompt": strconv.FormatUint(rm.prompt, 16)})
}

// meet waits for b's room on the prefill server and the KV's transfer, and
// returns the prompt tokens pulled; an error when the room's prefill did
// not come (the decode answers 503, as SGLang aborts it).
func (s *Server) meet(ctx context.Context, c *call, b *bootstrap) (int, *openai.Error) {
	p := s.pd
	if b.Host == nil || b.Port == nil || b.Room == nil {
		return 0, badRequest("bootstrap_room", "bootstrap_host, bootstrap_port and bootstrap_room go together")
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.BootstrapTimeout)
	defer cancel()
	u := url.URL{Scheme: "http", Host: net.JoinHostPort(*b.Host, strconv.Itoa(*b.Port)), Path: bootstrapPath + strconv.FormatUint(*b.Room, 10)}
	tokens, err := p.wait(ctx, u.String(), promptKey(c, s.profile.BlockSize))
	if err != nil {
		p.failed.Inc()
		s.log.Warn("bootstrap failed", "room", *b.Room, "err", err)
		return 0, &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeServer, Code: "kv_transfer_failed",
			Message: fmt.Sprintf("KV transfer from the prefill server failed: %v", err)}
	}
	tokens = min(tokens, c.req.PromptLen-1)
	return tokens, s.transfer(ctx, tokens)
}

// wait reads the prefill server's answer for a room, as long as ctx lets
// it wait for the room's prefill.
func (p *pd) wait(ctx context.Context, u string, prompt uint64) (int, error) {
	n, err := heldAt(ctx, http.DefaultClient, u, prompt)
	if err != nil {
		return 0, fmt.Errorf("prefill server: %w", err)
	}
	return n, nil
}

// transfer waits the modelled transfer of tokens' KV over the link and
// counts it.
func (s *Server) transfer(ctx context.Context, tokens int) *openai.Error {
	p := s.pd
	bytes := float64(tokens) * s.profile.KVBytesPerToken()
	model := time.Duration(bytes / p.cfg.LinkBandwidth * float64(time.Second))
	select {
	case <-s.clock.After(time.Duration(float64(model) * s.scale)):
	case <-ctx.Done():
		return unavailable()
	}
	p.xferTime.Observe(model.Seconds())
	p.xferBytes.Observe(bytes)
	return nil
}

// remoteKV brings a request's prompt KV from its prefill server, vLLM's
// way (pull) or SGLang's (meet), before c enters the engine.
func (s *Server) remoteKV(ctx context.Context, c *call, x *exchange) *openai.Error {
	switch {
	case x.kv != nil:
		c.req.RemoteTokens = s.pull(ctx, c, x.kv)
	case x.boot != nil && s.pd.consumer():
		n, e := s.meet(ctx, c, x.boot)
		if e != nil {
			return e
		}
		c.req.RemoteTokens = n
	}
	return nil
}
