package peers

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/fleet"
)

var (
	// errNoStream is a peer that does not serve StreamPath: an older
	// replica, polled instead.
	errNoStream = errors.New("peer does not serve the stream")
	// errSelf is a stream from this very replica.
	errSelf = errors.New("peer is this replica")
)

// supervise follows the stream of every target not yet followed, stops
// following those no longer listed, and returns the targets to poll: those
// that answered 404 to the stream less than retryStream ago. Call it from
// Run's loop only.
func (p *Poller) supervise(ctx context.Context, targets []string) (poll []string) {
	now := p.o.Now()
	want := make(map[string]bool, len(targets))
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, addr := range targets {
		want[addr] = true
		switch since, ok := p.polled[addr]; {
		case p.self[addr]:
		case ok && now.Sub(since) < retryStream:
			poll = append(poll, addr)
		case p.follows[addr] == nil:
			delete(p.polled, addr)
			fctx, cancel := context.WithCancel(ctx)
			p.follows[addr] = &following{cancel: cancel}
			p.wg.Add(1)
			go p.follow(fctx, addr)
		}
	}
	for addr, f := range p.follows {
		if !want[addr] {
			f.cancel()
			delete(p.follows, addr)
		}
	}
	for addr := range p.self {
		if !want[addr] {
			delete(p.self, addr)
		}
	}
	for addr := range p.polled {
		if !want[addr] {
			delete(p.polled, addr)
		}
	}
	return poll
}

// follow reads addr's stream until ctx ends, reconnecting after a failure
// with a backoff that doubles up to ReconnectMax, or until the peer turns
// out not to stream (then Run polls it) or to be this replica.
func (p *Poller) follow(ctx context.Context, addr string) {
	defer p.wg.Done()
	wait := reconnectMin
	for {
		began := p.o.Now()
		err := p.stream(ctx, addr)
		p.disconnected(addr)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errNoStream), errors.Is(err, errSelf):
			p.mu.Lock()
			if errors.Is(err, errSelf) {
				p.self[addr] = true
			} else {
				p.polled[addr] = p.o.Now()
				p.log.Info("peers: peer does not stream its counts; polling it", "peer", addr)
			}
			delete(p.follows, addr)
			p.mu.Unlock()
			return
		}
		p.log.Debug("peers: stream ended", "peer", addr, "err", err)
		if p.o.Now().Sub(began) > p.o.ReconnectMax {
			wait = reconnectMin // it had worked for a while: start the backoff over
		}
		p.reconnects.Inc()
		// Half the wait plus a random half, so that replicas that lost
		// the same peer do not all come back at once.
		t := time.NewTimer(wait/2 + rand.N(wait/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, p.o.ReconnectMax)
	}
}

// stream reads one connection to addr's stream until it fails. A line
// that is not an Update, or longer than maxReport, ends it with an error:
// that peer's only.
func (p *Poller) stream(ctx context.Context, addr string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// One timer bounds the wait for the answer (Timeout), then the
	// silence between lines: a peer sends a heartbeat every interval, so
	// MaxAge without a line is a dead connection, whose counts would no
	// longer count anyway.
	quiet := time.AfterFunc(p.o.Timeout, cancel)
	defer quiet.Stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, addr+StreamPath, nil)
	if err != nil {
		return err
	}
	resp, err := p.streams.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return errNoStream
	default:
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxReport)
	first := true
	for sc.Scan() {
		quiet.Reset(max(p.o.MaxAge, p.o.Timeout))
		var u Update
		if err := json.Unmarshal(sc.Bytes(), &u); err != nil {
			return fmt.Errorf("stream line: %w", err)
		}
		if first && (!u.Full || u.Replica == "") {
			return errors.New("stream did not start with a snapshot")
		}
		first = false
		if err := p.take(addr, &u); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	return io.ErrUnexpectedEOF
}

// take applies one line of addr's stream: the peer's counts are
// updated and the sums of the backends it names are applied at once, as
// of now.
func (p *Poller) take(addr string, u *Update) error {
	if u.Replica == p.id {
		return errSelf
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.o.Now()
	h := p.heard[addr]
	if h == nil || !h.live {
		if h == nil {
			h = &heard{}
			p.heard[addr] = h
		}
		h.live = true
		p.streaming.Inc()
	}
	h.at = now
	if u.Replica != "" {
		h.report.Replica = u.Replica
	}
	changed := make([]string, 0, len(u.Backends))
	if u.Full {
		for url := range h.report.Backends {
			changed = append(changed, url) // may be idle now
		}
		h.report.Backends = make(map[string]Counts, len(u.Backends))
	}
	if h.report.Backends == nil {
		h.report.Backends = make(map[string]Counts, len(u.Backends))
	}
	for url, c := range u.Backends {
		if c == (Counts{}) {
			delete(h.report.Backends, url)
		} else {
			h.report.Backends[url] = c
		}
		changed = append(changed, url)
	}
	if len(u.Backends) == 0 && !u.Full {
		return nil // a heartbeat
	}
	p.received.Inc()
	if u.Changed != 0 {
		p.lag.Observe(max(0, now.Sub(time.Unix(0, u.Changed)).Seconds()))
	}
	if u.Full {
		p.applyAll() // a peer (re)connected: every backend's number of peers may have changed
	} else {
		p.applyURLs(changed, now)
	}
	return nil
}

// disconnected marks addr's stream down: its counts count until MaxAge
// after its last line, as a poll's would.
func (p *Poller) disconnected(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h := p.heard[addr]; h != nil && h.live {
		h.live = false
		p.streaming.Dec()
	}
}

// applyURLs applies the sums of the backends named by urls, as of now:
// the pushed part is current, and a polled part counts as it would at the
// tick. Backends the fleet gained since the last tick wait for the next.
// Call with p.mu held.
func (p *Poller) applyURLs(urls []string, now time.Time) {
	if p.index == nil {
		return
	}
	type part struct {
		replica string
		counts  map[string]Counts
	}
	parts := make([]part, 0, len(p.heard))
	seen := make(map[string]bool, len(p.heard))
	for _, h := range p.heard {
		if (!h.live && now.Sub(h.at) > p.o.MaxAge) || h.report.Replica == p.id || seen[h.report.Replica] {
			continue
		}
		seen[h.report.Replica] = true
		parts = append(parts, part{h.report.Replica, h.report.Backends})
	}
	for _, url := range urls {
		b := p.index[url]
		if b == nil {
			continue
		}
		if len(parts) == 0 {
			b.SetPeerLoad(nil)
			continue
		}
		var sum fleet.Load
		for _, pt := range parts {
			sum = sum.Plus(pt.counts[url].load())
		}
		b.SetPeerLoad(&fleet.PeerLoad{Load: sum, Peers: len(parts), At: now})
	}
}

// peerCollector exports the other replicas' requests in flight on each
// backend, as this replica last applied them.
type peerCollector struct{ p *Poller }

var peerRequestsDesc = prometheus.NewDesc("kvroute_peer_requests",
	"Requests the other router replicas have in flight on a backend, as this replica last heard (absent when none count).",
	[]string{"backend"}, nil)

func (c peerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- peerRequestsDesc }

func (c peerCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.p.o.Now()
	for _, b := range c.p.backends() {
		if pl := b.PeerLoad(now, c.p.o.MaxAge); pl != nil {
			ch <- prometheus.MustNewConstMetric(peerRequestsDesc, prometheus.GaugeValue, float64(pl.Requests), b.Name)
		}
	}
}

var _ prometheus.Collector = peerCollector{}
var _ http.Handler = (*Hub)(nil)
