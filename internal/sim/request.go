package sim

import (
	"errors"
	"fmt"
	"math/bits"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/results"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/tokenizer"
	"github.com/kvroute/kvroute/internal/workload"
)

// flight is one request from the moment a router replica routes it until its
// last token: what the proxy's attempt and the client's call hold between
// them.
type flight struct {
	req     engine.Request // ID is the flight's index in simulation.flights
	rreq    router.Request
	t       *router.Ticket
	session int32
	replica int32
	sent    time.Duration
	first   time.Duration
	reply   string // text mode: the reply the client appends to its next turn
	hashes  []uint64
	// parent is set on a prefill leg: the flight it prefills (disagg.go).
	parent *flight
}

// convo is a session's conversation so far, in text mode: the messages as
// the emulator tokenizes them, and the canonical prompt the proxy renders for
// the router (role, newline, content, newline, for every message).
type convo struct {
	msgs []tokenizer.Message
	text []byte
}

func newConvo(s *workload.Session) *convo {
	c := &convo{}
	if s.System != "" {
		c.add("system", s.System)
	}
	return c
}

func (c *convo) add(role, content string) {
	c.msgs = append(c.msgs, tokenizer.Message{Role: role, Content: content})
	c.text = append(c.text, role...)
	c.text = append(c.text, '\n')
	c.text = append(c.text, content...)
	c.text = append(c.text, '\n')
}

// tokenMode reports whether cfg's workload runs without text: every session
// a single turn described by block ids, with no system prompt (the traces
// and mixed), and text not asked for.
func tokenMode(cfg Config) bool {
	if cfg.Text {
		return false
	}
	for i := range cfg.Workload.Sessions {
		s := &cfg.Workload.Sessions[i]
		if s.System != "" || len(s.Turns) != 1 || s.Turns[0].Blocks == nil {
			return false
		}
	}
	return true
}

// sessionOrder lists the sessions of the (tiled) workload by start time
// (tileStart: copies do not arrive in lockstep).
func sessionOrder(cfg Config) []sessionRef {
	ss := cfg.Workload.Sessions
	out := make([]sessionRef, 0, len(ss)*cfg.Tile)
	var scratch workload.SpreadScratch
	for t := range cfg.Tile {
		for i := range ss {
			out = append(out, sessionRef{start: tileStart(cfg, i, t, &scratch), base: int32(i), tile: int32(t)})
		}
	}
	slices.SortStableFunc(out, func(a, b sessionRef) int {
		switch {
		case a.start < b.start:
			return -1
		case a.start > b.start:
			return 1
		}
		return 0
	})
	return out
}

// newFlight takes a free flight.
func (s *simulation) newFlight() *flight {
	if n := len(s.free); n > 0 {
		id := s.free[n-1]
		s.free = s.free[:n-1]
		f := s.flights[id]
		f.req.Reset()
		f.req.ID = uint64(id)
		return f
	}
	f := &flight{req: engine.Request{ID: uint64(len(s.flights))}}
	s.flights = append(s.flights, f)
	return f
}

func (s *simulation) release(f *flight) {
	f.rreq, f.t, f.reply, f.parent = router.Request{}, nil, "", nil
	s.free = append(s.free, int32(f.req.ID))
}

// errTooLong is what a request longer than the model's context gets, as the
// emulator's 400 answer.
var errTooLong = errors.New("status 400: request longer than the model's context")

// send sends the current turn of session i: a router replica picks a server,
// the replica counts the request there, the server queues it.
func (s *simulation) send(i int) {
	ss := &s.sessions[i]
	ws := &s.cfg.Workload.Sessions[ss.base]
	turn := &ws.Turns[ss.turn]
	f := s.newFlight()
	f.session, f.sent = int32(i), s.now
	bs := s.cfg.Profile.BlockSize
	if s.text {
		ss.conv.add(turn.MessageRole(), turn.Text())
		s.tokBuf = tokenizer.EncodeChat(s.tokBuf[:0], ss.conv.msgs, true)
		promptLen := len(s.tokBuf)
		ids, pieces := tokenizer.Generate(tokenizer.ReplySeed(s.cfg.Seed, s.tokBuf), turn.MaxTokens)
		f.reply = strings.Join(pieces, "")
		s.tokBuf = append(s.tokBuf, ids...)
		f.hashes = engine.HashTokens(f.hashes[:0], s.tokBuf, bs)
		f.req.PromptLen, f.req.MaxTokens = promptLen, turn.MaxTokens
		f.rreq = router.Request{Model: s.model(ws.Model),
			SessionKey: ws.ID, Prompt: string(ss.conv.text), MaxTokens: turn.MaxTokens}
	} else {
		f.hashes = tokenHashes(f.hashes[:0], &s.salted, turn, ss.tile, bs)
		f.req.PromptLen, f.req.MaxTokens = turn.Tokens, turn.MaxTokens
		key := ws.ID
		if s.cfg.Tile > 1 {
			key = ws.ID + "/" + strconv.Itoa(int(ss.tile))
		}
		f.rreq = router.Request{Model: s.model(ws.Model),
			SessionKey: key, MaxTokens: turn.MaxTokens, PromptTokens: turn.Tokens,
			TokenBlocks: f.hashes[:min(len(f.hashes), turn.Tokens/bs)], TokenBlockSize: bs}
	}
	f.req.BlockHashes = f.hashes
	s.adapters.apply(f, ws.Adapter)

	f.replica = 0
	if len(s.replicas) > 1 {
		f.replica = int32(s.split.IntN(len(s.replicas)))
	}
	rep := s.replicas[f.replica]
	if s.cfg.GossipEachRequest && len(s.replicas) > 1 {
		s.gossip()
	}
	if s.kv != nil {
		s.kv.routing(f.hashes, f.req.PromptLen)
	}
	s.priceSplit(f)                                                    // disagg.go
	t, err := rep.router.Route(&f.rreq, s.decoders(rep, f.rreq.Model)) // disagg.go: the decode servers of its model
	if err != nil {
		s.fail(f, 0, err)
		return
	}
	f.t = t
	if s.push != nil {
		s.push.changed(int(f.replica), t.Backend.Index)
	}
	sv := &s.servers[t.Backend.Index]
	if f.req.PromptLen+f.req.MaxTokens > s.cfg.serverProfile(t.Backend.Index).MaxModelLen {
		s.fail(f, http.StatusBadRequest, errTooLong)
		return
	}
	if s.pd != nil && s.prefillFirst(f) { // disagg.go
		return
	}
	s.cut(t.Backend.Index)
	if err := sv.eng.Add(s.now, &f.req); err != nil {
		s.fail(f, http.StatusBadRequest, fmt.Errorf("status 400: %w", err))
		return
	}
	if !sv.stepping {
		sv.stepping = true
		s.q.push(s.now, evStepStart, int32(t.Backend.Index))
	}
}

// tokenHashes appends the engine block hashes of a block-described turn:
// the prompt's from its block ids (offset per tile, so that copies share
// nothing), then the reply's, chained on, so that the reply takes cache
// space as it does in the emulator. Equal prompts get equal replies there
// too, so the reply's hashes depend only on the prompt.
// The salted ids are built in *scratch, reused from call to call (nil: a
// new slice each time).
func tokenHashes(dst []uint64, scratch *[]uint64, t *workload.Turn, tile int32, blockSize int) []uint64 {
	ids := t.Blocks
	if tile > 0 {
		// The salt reaches the low bits: HashBlockIDs multiplies an id by
		// the trace's block tokens, which shifted a salt in the high bits
		// (tile<<48) out, and at 512 tokens tiles 128 apart shared every
		// prompt.
		var salted []uint64
		if scratch != nil {
			salted = (*scratch)[:0]
		}
		for _, id := range ids {
			salted = append(salted, id+uint64(tile)*0x9e3779b97f4a7c15)
		}
		if scratch != nil {
			*scratch = salted
		}
		ids = salted
	}
	if n := (t.Tokens + t.MaxTokens) / max(blockSize, 1); cap(dst) < n {
		// A flight's list, reused, grows to its longest request once, in
		// one step of a power of two: grown as needed, a fleet with
		// 16-token blocks allocated and cleared a gigabyte of them.
		dst = make([]uint64, 0, 1<<bits.Len(uint(n)))
	}
	dst = engine.HashBlockIDs(dst, ids, t.BlockTokens, t.Tokens, blockSize)
	if len(dst) < t.Tokens/blockSize || len(dst) == 0 {
		return dst // the ids do not cover the prompt: nothing to chain on
	}
	parent := dst[len(dst)-1]
	for j := len(dst); (j+1)*blockSize <= t.Tokens+t.MaxTokens; j++ {
		parent = engine.ChainHash(parent, 0x7265706c79<<24^uint64(j))
		dst = append(dst, parent)
	}
	return dst
}

// fail ends a request that never ran: no backend, or one that refused it.
func (s *simulation) fail(f *flight, status int, err error) {
	i := int(f.session)
	ss := &s.sessions[i]
	res := results.Result{Session: int(ss.base), Turn: int(ss.turn), Status: status,
		Heavy: s.turnOf(i).Heavy, Sent: f.sent, Err: err, Error: err.Error()}
	if f.t != nil {
		res.Backend, res.Route = f.t.Backend.Name, f.t.Reason
		f.t.Finish(router.Failed(status))
		if s.push != nil {
			s.push.changed(int(f.replica), f.t.Backend.Index)
		}
	}
	s.record(res)
	s.release(f)
	s.endSession(i) // the conversation cannot go on without its reply
}

// finish ends a request whose last token came at s.now: the replica
// releases its load and learns the outcome, the client records it and sends
// the session's next turn after its think time.
func (s *simulation) finish(f *flight) {
	r := &f.req
	ttft, e2e := f.first-f.sent, s.now-f.sent
	f.t.Finish(router.Outcome{Status: http.StatusOK,
		PromptTokens: r.PromptLen, CachedTokens: r.CachedTokens, CompletionTokens: r.Output,
		TTFT: ttft, Latency: e2e, Tokens: r.Output})
	if s.push != nil {
		s.push.changed(int(f.replica), f.t.Backend.Index)
	}
	i := int(f.session)
	ss := &s.sessions[i]
	res := results.Result{
		Session: int(ss.base), Turn: int(ss.turn), Heavy: s.turnOf(i).Heavy,
		Backend: f.t.Backend.Name, Route: f.t.Reason, Status: http.StatusOK,
		Sent: f.sent, TTFT: ttft, E2E: e2e, ServerTTFT: r.FirstToken - r.Arrival,
		PromptTokens: r.PromptLen, CachedTokens: r.CachedTokens, CompletionTokens: r.Output,
		PredictedCached: f.t.Cached,
		PredictedTTFT:   f.t.PredictedTTFT, PredictedTTFTLow: f.t.PredictedTTFTLow, PredictedTTFTHigh: f.t.PredictedTTFTHigh,
		PredictedITL: f.t.PredictedITL,
	}
	if r.Output > 1 {
		res.ITL = (e2e - ttft) / time.Duration(r.Output-1)
	}
	if s.bounds {
		n := min(len(f.hashes), r.PromptLen/s.cfg.Profile.BlockSize)
		res.PromptBlocks = slices.Clone(f.hashes[:n])
		res.SequenceBlocks = slices.Clone(f.hashes)
	}
	s.record(res)
	if ss.conv != nil {
		ss.conv.add("assistant", f.reply)
	}
	s.release(f)
	ss.turn++
	if int(ss.turn) < len(s.cfg.Workload.Sessions[ss.base].Turns) {
		s.q.push(s.now+s.turnOf(i).Think, evSend, int32(i))
	} else {
		s.endSession(i)
	}
}

func (s *simulation) record(r results.Result) {
	s.sum.Add(&r)
	if s.keepAll || s.recorded%s.stride == 0 {
		s.kept = append(s.kept, r)
	}
	s.recorded++
	if s.progress != nil {
		s.progress()
	}
}

// sortByBusy orders idx by the backends' busy time, busiest first.
func sortByBusy(idx []int, bs []results.BackendSeries) {
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case bs[a].Busy > bs[b].Busy:
			return -1
		case bs[a].Busy < bs[b].Busy:
			return 1
		}
		return 0
	})
}
