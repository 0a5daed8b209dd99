package peers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/fleet"
)

// Defaults of Options, each in docs/operations.md.
const (
	// DefaultInterval is how often a replica polls its peers: a burst
	// shorter than it may still herd, so it is shorter than a prefill.
	DefaultInterval = 100 * time.Millisecond
	// DefaultTimeout bounds one poll of one peer.
	DefaultTimeout = time.Second
	// maxReport bounds a report's size: a thousand backends' counts fit in
	// a hundred kilobytes.
	maxReport = 4 << 20
)

// Options configures a Poller.
type Options struct {
	// Peers are the other replicas' base URLs (http://host:port, where
	// they serve Path). "dns+http://name:port" stands for every address
	// name resolves to, looked up at every poll: a headless Service of the
	// router's own pods. Listing the replica itself is harmless.
	Peers []string
	// Interval and Timeout pace the polls (defaults above).
	Interval, Timeout time.Duration
	// MaxAge is how long a report counts (the policy's PeerMaxAge).
	MaxAge time.Duration
	// Client fetches the reports; nil means a client of its own.
	Client *http.Client
	// Resolver looks up dns+http peers; nil means net.DefaultResolver.
	Resolver interface {
		LookupHost(ctx context.Context, host string) ([]string, error)
	}
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives failures; nil means slog.Default().
	Logger *slog.Logger
	// Registerer receives the poller's metrics; nil means none.
	Registerer prometheus.Registerer
}

// Poller polls a replica's peers and keeps the sum of their reports on the
// fleet's backends.
type Poller struct {
	id       string
	backends func() []*fleet.Backend
	o        Options
	log      *slog.Logger

	mu    sync.Mutex
	heard map[string]heard // by peer address

	polls *prometheus.CounterVec
	fresh prometheus.Gauge
}

// heard is a peer's last report and when it was fetched.
type heard struct {
	report Report
	at     time.Time
}

// NewPoller returns the poller of replica id, whose fleet is backends.
func NewPoller(id string, backends func() []*fleet.Backend, o Options) *Poller {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxAge <= 0 {
		o.MaxAge = 10 * o.Interval
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: o.Timeout}
	}
	if o.Resolver == nil {
		o.Resolver = net.DefaultResolver
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	p := &Poller{id: id, backends: backends, o: o, log: o.Logger, heard: make(map[string]heard)}
	if p.log == nil {
		p.log = slog.Default()
	}
	p.polls = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_peer_polls_total",
		Help: "Polls of other router replicas' in-flight counts, by result (ok, error)."}, []string{"result"})
	p.fresh = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_peers_heard",
		Help: "Other router replicas whose in-flight counts are recent enough to count."})
	for _, r := range []string{"ok", "error"} {
		p.polls.WithLabelValues(r)
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(p.polls, p.fresh)
	}
	return p
}

// Run polls until ctx ends.
func (p *Poller) Run(ctx context.Context) error {
	t := time.NewTicker(p.o.Interval)
	defer t.Stop()
	for {
		p.Poll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Poll fetches every peer's report once, concurrently, and applies the
// fresh ones to the fleet.
func (p *Poller) Poll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, addr := range p.targets(ctx) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := p.fetch(ctx, addr)
			if err != nil {
				p.polls.WithLabelValues("error").Inc()
				p.log.Debug("peers: poll failed", "peer", addr, "err", err)
				return
			}
			p.polls.WithLabelValues("ok").Inc()
			p.mu.Lock()
			p.heard[addr] = heard{report: r, at: p.o.Now()}
			p.mu.Unlock()
		}()
	}
	wg.Wait()
	p.apply()
}

// targets expands the configured peers into base URLs.
func (p *Poller) targets(ctx context.Context) []string {
	var out []string
	for _, peer := range p.o.Peers {
		rest, ok := strings.CutPrefix(peer, "dns+")
		if !ok {
			out = append(out, strings.TrimSuffix(peer, "/"))
			continue
		}
		u, err := url.Parse(rest)
		if err != nil {
			continue // checked at start (Validate)
		}
		addrs, err := p.o.Resolver.LookupHost(ctx, u.Hostname())
		if err != nil {
			p.log.Debug("peers: lookup failed", "peer", peer, "err", err)
			continue
		}
		for _, a := range addrs {
			out = append(out, u.Scheme+"://"+net.JoinHostPort(a, u.Port()))
		}
	}
	return out
}

func (p *Poller) fetch(ctx context.Context, base string) (Report, error) {
	ctx, cancel := context.WithTimeout(ctx, p.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+Path, nil)
	if err != nil {
		return Report{}, err
	}
	resp, err := p.o.Client.Do(req)
	if err != nil {
		return Report{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Report{}, fmt.Errorf("status %d", resp.StatusCode)
	}
	var r Report
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxReport)).Decode(&r); err != nil {
		return Report{}, fmt.Errorf("decode report: %w", err)
	}
	return r, nil
}

// apply sums the fresh reports of replicas other than this one onto the
// fleet's backends, and forgets the stale.
func (p *Poller) apply() {
	now := p.o.Now()
	sum := make(map[string]fleet.Load)
	peers, oldest := 0, now
	seen := make(map[string]bool) // a replica reached at two addresses counts once
	p.mu.Lock()
	for addr, h := range p.heard {
		switch {
		case now.Sub(h.at) > p.o.MaxAge:
			delete(p.heard, addr)
			continue
		case h.report.Replica == p.id || seen[h.report.Replica]:
			continue
		}
		seen[h.report.Replica] = true
		peers++
		if h.at.Before(oldest) {
			oldest = h.at
		}
		for u, c := range h.report.Backends {
			sum[u] = sum[u].Plus(c.load())
		}
	}
	p.mu.Unlock()
	p.fresh.Set(float64(peers))
	for _, b := range p.backends() {
		if peers == 0 || b.URL == nil {
			b.SetPeerLoad(nil)
			continue
		}
		b.SetPeerLoad(&fleet.PeerLoad{Load: sum[b.URL.String()], Peers: peers, At: oldest})
	}
}

// Validate checks the peers' syntax, for a clear error at start-up.
func Validate(peers []string) error {
	for _, peer := range peers {
		u, err := url.Parse(strings.TrimPrefix(peer, "dns+"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("peer %q: want http://host:port or dns+http://name:port", peer)
		}
		if strings.HasPrefix(peer, "dns+") && u.Port() == "" {
			return fmt.Errorf("peer %q: a dns+ peer needs a port", peer)
		}
	}
	return nil
}
