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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/fleet"
)

// Defaults of Options, each in docs/operations.md.
const (
	// DefaultInterval is how often a replica polls the peers it cannot
	// follow, re-resolves dns+http peers and refreshes every backend's sum;
	// it is also the stream's heartbeat. A burst shorter than it may still
	// herd behind a polled peer, so it is shorter than a prefill.
	DefaultInterval = 100 * time.Millisecond
	// DefaultTimeout bounds one poll of one peer, the wait for a stream's
	// answer, and a follower's write.
	DefaultTimeout = time.Second
	// DefaultReconnectMax is the longest wait between attempts to follow a
	// peer's stream; the waits double from reconnectMin up to it.
	DefaultReconnectMax = 2 * time.Second
	// reconnectMin is the first wait before following a peer again.
	reconnectMin = 50 * time.Millisecond
	// retryStream is how long a peer that answered 404 to StreamPath is
	// polled before it is asked again (it may have been upgraded).
	retryStream = time.Minute
	// maxReport bounds a report's size, and a stream line's: a thousand
	// backends' counts fit in a hundred kilobytes.
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
	// Push follows each peer's stream (StreamPath) instead of polling it,
	// falling back to the poll for a peer that answers 404.
	Push bool
	// ReconnectMax is the longest wait between attempts to follow a
	// peer's stream (DefaultReconnectMax).
	ReconnectMax time.Duration
	// Client fetches the reports; nil means a client of its own. Streams
	// use its Transport without its Timeout.
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
	// Pushed, when set, is told after every tick whether every peer's
	// counts now come by its stream, none by a poll: a policy that takes
	// pushed counts as all but exact must not take polled ones so
	// (kvroute.Config.PeersPushed).
	Pushed *atomic.Bool
}

// Poller follows a replica's peers, by their streams or by polls, and
// keeps the sum of their counts on the fleet's backends.
//
// With Push, the stream replaces the poll for every peer that serves it;
// the poll does not run beside it as a heartbeat. Two connections to one
// peer have no order between them: a poll answered before a push but read
// after it would put back counts the push had replaced, the staleness the
// push removes. The stream heals itself instead (absolute counts, a
// snapshot on every connection) and carries its own heartbeat, so a
// second source would only add load. What remains of the poll's loop is
// the Interval tick: it re-resolves dns+http peers, starts and stops
// streams, polls the peers that do not stream, and refreshes every
// backend's sum (forgetting peers silent for MaxAge).
type Poller struct {
	id       string
	backends func() []*fleet.Backend
	o        Options
	log      *slog.Logger
	streams  *http.Client // o.Client's transport, without a timeout

	mu      sync.Mutex
	heard   map[string]*heard         // by peer address
	index   map[string]*fleet.Backend // the fleet's backends by URL, rebuilt every tick
	follows map[string]*following     // streams followed, by peer address
	polled  map[string]time.Time      // peers without a stream, since when
	self    map[string]bool           // addresses that are this replica
	wg      sync.WaitGroup            // the streams' goroutines

	// replicas is the other replicas' names, sorted, as of the last
	// applyAll: read on every pick in a burst, without the lock.
	replicas atomic.Pointer[[]string]

	polls      *prometheus.CounterVec
	fresh      prometheus.Gauge
	streaming  prometheus.Gauge
	received   prometheus.Counter
	reconnects prometheus.Counter
	lag        prometheus.Histogram
}

// heard is a peer's last counts and when they were last heard of.
type heard struct {
	report Report
	at     time.Time
	// live is set while the peer's stream is connected: its counts are
	// current, not as of at.
	live bool
}

// following is one peer's stream being followed.
type following struct{ cancel context.CancelFunc }

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
	if o.ReconnectMax <= 0 {
		o.ReconnectMax = DefaultReconnectMax
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
	p := &Poller{id: id, backends: backends, o: o, log: o.Logger, heard: make(map[string]*heard),
		follows: make(map[string]*following), polled: make(map[string]time.Time), self: make(map[string]bool),
		streams: &http.Client{Transport: o.Client.Transport}}
	if p.log == nil {
		p.log = slog.Default()
	}
	p.polls = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_peer_polls_total",
		Help: "Polls of other router replicas' in-flight counts, by result (ok, error)."}, []string{"result"})
	p.fresh = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_peers_heard",
		Help: "Other router replicas whose in-flight counts are recent enough to count."})
	p.streaming = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_peers_streaming",
		Help: "Other router replicas whose count stream is followed and connected now."})
	p.received = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_peer_stream_updates_received_total",
		Help: "Lines of changed in-flight counts received from other replicas' streams (heartbeats not counted)."})
	p.reconnects = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_peer_stream_reconnects_total",
		Help: "Attempts to follow a peer's count stream again after it failed or ended."})
	p.lag = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvroute_peer_stream_lag_seconds",
		Help:    "From a count change on another replica (its clock) to its application here (this clock): clock skew between hosts adds to it.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14)})
	for _, r := range []string{"ok", "error"} {
		p.polls.WithLabelValues(r)
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(p.polls, p.fresh, p.streaming, p.received, p.reconnects, p.lag, peerCollector{p})
	}
	return p
}

// Run follows or polls the peers until ctx ends, and waits for the
// streams it followed to stop.
func (p *Poller) Run(ctx context.Context) error {
	defer p.wg.Wait()
	t := time.NewTicker(p.o.Interval)
	defer t.Stop()
	for {
		targets := p.targets(ctx)
		if p.o.Push {
			targets = p.supervise(ctx, targets)
		}
		if p.o.Pushed != nil {
			p.o.Pushed.Store(p.o.Push && len(targets) == 0)
		}
		p.poll(ctx, targets)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Poll fetches every peer's report once, concurrently, and applies the
// fresh ones to the fleet.
func (p *Poller) Poll(ctx context.Context) { p.poll(ctx, p.targets(ctx)) }

func (p *Poller) poll(ctx context.Context, targets []string) {
	var wg sync.WaitGroup
	for _, addr := range targets {
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
			p.heard[addr] = &heard{report: r, at: p.o.Now()}
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

// apply sums the fresh counts of replicas other than this one onto every
// backend of the fleet, and forgets the stale. The sum is as of its oldest
// part: now for a connected stream, the time of the report for a poll.
func (p *Poller) apply() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.applyAll()
}

// applyAll is apply with p.mu held.
func (p *Poller) applyAll() {
	now := p.o.Now()
	sum := make(map[string]fleet.Load)
	peers, oldest := 0, now
	seen := make(map[string]bool) // a replica reached at two addresses counts once
	for addr, h := range p.heard {
		switch {
		case !h.live && now.Sub(h.at) > p.o.MaxAge:
			delete(p.heard, addr)
			continue
		case h.report.Replica == p.id || seen[h.report.Replica]:
			continue
		}
		seen[h.report.Replica] = true
		peers++
		if !h.live && h.at.Before(oldest) {
			oldest = h.at
		}
		for u, c := range h.report.Backends {
			sum[u] = sum[u].Plus(c.load())
		}
	}
	p.fresh.Set(float64(peers))
	ids := make([]string, 0, len(seen))
	for id := range seen {
		if id != "" {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if old := p.replicas.Load(); old == nil || !slices.Equal(*old, ids) {
		p.replicas.Store(&ids)
	}
	bs := p.backends()
	p.index = make(map[string]*fleet.Backend, len(bs))
	for _, b := range bs {
		if b.URL == nil {
			continue
		}
		p.index[b.URL.String()] = b
		if peers == 0 {
			b.SetPeerLoad(nil)
			continue
		}
		b.SetPeerLoad(&fleet.PeerLoad{Load: sum[b.URL.String()], Peers: peers, At: oldest})
	}
}

// Replicas returns the names of the other replicas whose counts count
// (their reports' Replica), sorted, as of the last tick or connected
// stream: a peer gone silent leaves them within an Interval of MaxAge.
// With this replica's own name they are what a burst's lanes are split by
// (kvroute.Config.Lanes), the same for every replica that hears the
// same peers. The slice is shared: the caller must not change it.
func (p *Poller) Replicas() []string {
	if ids := p.replicas.Load(); ids != nil {
		return *ids
	}
	return nil
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
