package sim

import (
	"context"
	"math"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// run processes events until every session has ended.
func (s *simulation) run(ctx context.Context) error {
	if s.cfg.Users > 0 {
		for range min(s.cfg.Users, s.order.total) {
			s.startNext(0)
		}
	} else {
		s.q.push(s.order.peek().start, evSession, 0)
	}
	for r := range s.replicas {
		// Replicas scrape at staggered phases, as independent processes do.
		s.q.push(s.cfg.Scrape*time.Duration(r)/time.Duration(len(s.replicas)), evScrape, int32(r))
	}
	s.q.push(0, evSample, 0)
	if s.cfg.Gossip > 0 && len(s.replicas) > 1 {
		s.q.push(s.cfg.Gossip, evGossip, 0)
	}
	for s.q.len() > 0 {
		if s.events&0xffff == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		ev := s.q.pop()
		s.events++
		s.now = ev.at
		switch ev.kind {
		case evSession:
			s.startNext(s.now)
			if s.order.left() {
				s.q.push(s.order.peek().start, evSession, 0)
			}
		case evSend:
			s.send(int(ev.idx))
		case evStepStart:
			s.step(int(ev.idx))
		case evStepEnd:
			if ev.seq == s.servers[ev.idx].end {
				s.endStep(int(ev.idx))
			}
		case evScrape:
			s.scrape(int(ev.idx))
			if !s.done() {
				s.q.push(s.now+s.cfg.Scrape, evScrape, ev.idx)
			}
		case evGossip:
			s.gossip()
			if !s.done() {
				s.q.push(s.now+s.cfg.Gossip, evGossip, 0)
			}
		case evSample:
			s.sample()
			if !s.done() {
				s.q.push(s.now+s.sampleEvery, evSample, 0)
			}
		case evKVEvents:
			s.kv.deliver(int(ev.idx))
		case evPush:
			s.push.deliver()
		case evTransferred:
			s.transferred(ev.idx) // disagg.go
		}
	}
	return nil
}

// done reports whether nothing is left to happen but the periodic events.
func (s *simulation) done() bool {
	return !s.order.left() && s.active == 0
}

// startNext starts the next session of the workload at now (its first turn
// after its think time).
func (s *simulation) startNext(now time.Duration) {
	if !s.order.left() {
		return
	}
	ref := s.order.pop()
	i := len(s.sessions)
	if n := len(s.idle); n > 0 {
		i = int(s.idle[n-1])
		s.idle = s.idle[:n-1]
	} else {
		s.sessions = append(s.sessions, session{})
	}
	s.sessions[i] = session{base: ref.base, tile: ref.tile}
	if s.text {
		s.sessions[i].conv = newConvo(&s.cfg.Workload.Sessions[ref.base])
	}
	s.active++
	s.q.push(now+s.turnOf(i).Think, evSend, int32(i))
}

// turnOf returns the current turn of session i.
func (s *simulation) turnOf(i int) *workload.Turn {
	ss := &s.sessions[i]
	return &s.cfg.Workload.Sessions[ss.base].Turns[ss.turn]
}

// endSession ends session i at now; closed loop, its user starts another.
func (s *simulation) endSession(i int) {
	s.sessions[i].conv = nil
	s.idle = append(s.idle, int32(i))
	s.active--
	if s.cfg.Users > 0 {
		s.startNext(s.now)
	}
}

// step starts a step on idle server i, or a run of silent decode steps, or
// leaves it idle if nothing can be scheduled.
func (s *simulation) step(i int) {
	sv := &s.servers[i]
	if !s.stepwise {
		if end := sv.eng.Coast(s.now, math.MaxInt); end > s.now {
			sv.coasting = true
			sv.end = s.q.push(end, evStepEnd, int32(i))
			return
		}
	}
	if s.kv != nil {
		s.kv.stepping = i
	}
	res := sv.eng.Step(s.now)
	if s.kv != nil {
		s.kv.stepped(i, max(res.End, s.now))
	}
	if res.End <= res.Start {
		// Nothing could be scheduled (no work, or waiting for KV that only
		// a departure frees): the next arrival wakes it.
		sv.stepping = false
		return
	}
	sv.res = res
	sv.end = s.q.push(res.End, evStepEnd, int32(i))
}

// endStep delivers the tokens of server i's step and starts its next. A
// run of silent steps has none to deliver.
func (s *simulation) endStep(i int) {
	sv := &s.servers[i]
	if sv.coasting {
		sv.coasting = false
		sv.eng.Settle(s.now)
	} else {
		for _, r := range sv.res.Tokens {
			f := s.flights[r.ID]
			if f.parent != nil { // a prefill leg (disagg.go)
				if r.State == engine.StateFinished {
					s.prefilled(f)
				}
				continue
			}
			if r.Output == 1 {
				f.first = s.now
				f.t.FirstToken()
				if s.push != nil {
					s.push.changed(int(f.replica), i)
				}
			}
			if r.State == engine.StateFinished {
				s.finish(f)
			}
		}
	}
	if sv.eng.HasWork() {
		s.step(i)
	} else {
		sv.stepping = false
	}
}

// cut ends server i's run of silent steps, if it has one, with the step in
// flight at now, so that a request arriving now joins the step after it.
func (s *simulation) cut(i int) {
	sv := &s.servers[i]
	if !sv.coasting {
		return
	}
	if end, ok := sv.eng.Cut(s.now); ok {
		sv.end = s.q.push(end, evStepEnd, int32(i))
	}
}
