package sim

import (
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// pushFeed models router replicas that stream their in-flight counts to
// each other (Config.GossipPush): every change of a replica's count on a
// server (a request routed there, its first token, its end) is sent to
// every other replica and reaches them all GossipPush later, in the order
// sent. Each replica then counts a server's load as its own plus the
// others' last delivered counts. The delay is the same for every message,
// so they arrive in the order they were sent and one queue holds them.
type pushFeed struct {
	s *simulation
	// sent are the changes in flight, oldest first, from head on.
	sent []pushed
	head int
	// last is each replica's count on each server as delivered, and when
	// it was taken; total their sum over the replicas, per server.
	last  [][]fleet.Load
	taken [][]time.Duration
	total []fleet.Load
}

// pushed is one replica's count on one server, taken at at.
type pushed struct {
	load    fleet.Load
	at      time.Duration
	replica int32
	server  int32
}

func newPushFeed(s *simulation) *pushFeed {
	p := &pushFeed{s: s, total: make([]fleet.Load, len(s.servers))}
	for range s.replicas {
		p.last = append(p.last, make([]fleet.Load, len(s.servers)))
		p.taken = append(p.taken, make([]time.Duration, len(s.servers)))
	}
	// A replica that joins its peers first hears all they have: nothing,
	// at the start of a run.
	for i := range s.servers {
		p.publish(i, 0)
	}
	return p
}

// changed sends replica r's count on server i, which just changed.
func (p *pushFeed) changed(r, i int) {
	s := p.s
	p.sent = append(p.sent, pushed{load: s.replicas[r].backends[i].Load(), at: s.now, replica: int32(r), server: int32(i)})
	s.q.push(s.now+s.cfg.GossipPush, evPush, 0)
}

// deliver hands the oldest change in flight to the other replicas. A poll
// (Config.Gossip as well) may have told them newer counts already.
func (p *pushFeed) deliver() {
	m := p.sent[p.head]
	p.sent[p.head] = pushed{}
	p.head++
	if p.head > len(p.sent)/2 && p.head > 1024 {
		p.sent = p.sent[:copy(p.sent, p.sent[p.head:])]
		p.head = 0
	}
	r, i := int(m.replica), int(m.server)
	if m.at < p.taken[r][i] {
		return
	}
	p.total[i] = p.total[i].Minus(p.last[r][i]).Plus(m.load)
	p.last[r][i], p.taken[r][i] = m.load, m.at
	p.publish(i, m.at)
}

// publish gives every replica the others' last counts on server i. Their
// time is that of the newest count in the sum: the prefill a replica
// counts for its peers has been computing at least since then (the
// drain of kvroute's queue model), and a count that has not changed since
// an older report is still exact.
func (p *pushFeed) publish(i int, at time.Duration) {
	s := p.s
	when := s.origin.Add(at)
	for r, rep := range s.replicas {
		rep.backends[i].SetPeerLoad(&fleet.PeerLoad{Load: p.total[i].Minus(p.last[r][i]), Peers: len(s.replicas) - 1, At: when})
	}
}

// polled records a round of polls (simulation.gossip), which told every
// replica every other's current counts: changes still in flight are older.
func (p *pushFeed) polled() {
	s := p.s
	for i := range s.servers {
		p.total[i] = fleet.Load{}
		for r, rep := range s.replicas {
			p.last[r][i], p.taken[r][i] = rep.backends[i].Load(), s.now
			p.total[i] = p.total[i].Plus(p.last[r][i])
		}
	}
}
