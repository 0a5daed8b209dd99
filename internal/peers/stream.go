package peers

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/fleet"
)

// A poll every 100 ms tells the other replicas of a pick up to a poll
// later, and a burst split across replicas is placed in less than that:
// each replica routes its share onto the backend it believes idle before
// any poll reaches the others. So a replica also pushes its counts: it
// serves them as a stream (StreamPath) that sends a backend's new counts
// the moment they change, and its peers follow that stream (Poller with
// Options.Push). Counts are absolute, never deltas: a line lost with a
// connection, or changes coalesced while a write was pending, heal with
// the next line, and every connection starts with a full snapshot.

// StreamPath is where a replica streams its counts as they change, beside
// Path on the same listener.
const StreamPath = "/kvroute/peers/stream"

// Update is one line of the stream, newline-delimited JSON.
type Update struct {
	// Replica names the sender; set on the first line.
	Replica string `json:"replica,omitempty"`
	// Full says Backends is the sender's whole report (Snapshot): a
	// backend it leaves out is idle. Otherwise Backends holds only the
	// backends whose counts changed, zero counts included.
	Full bool `json:"full,omitempty"`
	// Backends are absolute counts by backend URL, as in Report.
	Backends map[string]Counts `json:"backends,omitempty"`
	// Changed is when the earliest change in the line happened, in Unix
	// nanoseconds of the sender's clock, for the receiver's lag metric.
	// A line without counts is a heartbeat: the sender is alive and its
	// counts are as last sent.
	Changed int64 `json:"changed,omitempty"`
}

// Defaults of HubOptions.
const (
	// DefaultMaxSubscribers bounds the replicas following one hub: more
	// are answered 503, so that a misconfigured client cannot hold a
	// writer per connection without end.
	DefaultMaxSubscribers = 256
)

// HubOptions configures a Hub.
type HubOptions struct {
	// Heartbeat is how often an idle stream sends a line without counts,
	// so that its followers tell a quiet replica from a dead connection
	// (default DefaultInterval).
	Heartbeat time.Duration
	// WriteTimeout bounds one line's write to a follower: one that cannot
	// take it in time is dropped, never waited for (default
	// DefaultTimeout). It reconnects and starts again from a snapshot.
	WriteTimeout time.Duration
	// MaxSubscribers bounds the followers (default DefaultMaxSubscribers).
	MaxSubscribers int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives dropped followers; nil means slog.Default().
	Logger *slog.Logger
	// Registerer receives the hub's metrics; nil means none.
	Registerer prometheus.Registerer
}

// Hub streams a replica's counts to the replicas following it. Changed is
// its only part on the request path: it marks the backend changed for
// every follower and wakes the follower's writer with a send on a channel
// of one that never blocks; each follower's own handler goroutine writes.
// A follower's pending changes are a set of backends, so its memory is
// bounded by the fleet whatever the rate of changes, and changes that
// arrive while a write is pending go out together in the next line, each
// backend with its counts as they are then. A Hub is safe for concurrent
// use.
type Hub struct {
	id       string
	backends func() []*fleet.Backend
	o        HubOptions
	log      *slog.Logger

	n    atomic.Int32 // followers, read by Changed without the lock
	mu   sync.Mutex   // guards subs and every follower's dirty and since
	subs map[*follower]struct{}
	done chan struct{}
	once sync.Once

	sent, dropped prometheus.Counter
	subscribers   prometheus.Gauge
}

// follower is one replica following the hub.
type follower struct {
	wake  chan struct{} // capacity 1: a pending wake-up stands for any number of changes
	dirty map[*fleet.Backend]struct{}
	since time.Time // when the earliest change in dirty happened
}

// NewHub returns the hub of replica id, whose fleet is backends. Make
// Changed the fleet's load watcher (fleet.Fleet.WatchLoad) and serve the
// hub at StreamPath.
func NewHub(id string, backends func() []*fleet.Backend, o HubOptions) *Hub {
	if o.Heartbeat <= 0 {
		o.Heartbeat = DefaultInterval
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultTimeout
	}
	if o.MaxSubscribers <= 0 {
		o.MaxSubscribers = DefaultMaxSubscribers
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	h := &Hub{id: id, backends: backends, o: o, log: o.Logger, subs: make(map[*follower]struct{}), done: make(chan struct{})}
	if h.log == nil {
		h.log = slog.Default()
	}
	h.sent = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_peer_stream_updates_sent_total",
		Help: "Lines of changed in-flight counts this replica streamed to the replicas following it (heartbeats not counted)."})
	h.dropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_peer_stream_dropped_total",
		Help: "Followers of this replica's count stream dropped because a line could not be written within the write timeout."})
	h.subscribers = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_peer_stream_subscribers",
		Help: "Replicas following this replica's count stream now."})
	if o.Registerer != nil {
		o.Registerer.MustRegister(h.sent, h.dropped, h.subscribers)
	}
	return h
}

// Changed records that b's counts changed: every follower's writer sends
// them soon. It never blocks and costs one atomic load when nobody
// follows.
func (h *Hub) Changed(b *fleet.Backend) {
	if h.n.Load() == 0 {
		return
	}
	var now time.Time
	h.mu.Lock()
	for f := range h.subs {
		if len(f.dirty) == 0 {
			if now.IsZero() {
				now = h.o.Now()
			}
			f.since = now
		}
		f.dirty[b] = struct{}{}
		select {
		case f.wake <- struct{}{}:
		default:
		}
	}
	h.mu.Unlock()
}

// Close ends every stream and refuses new ones (503), so that a server's
// shutdown does not wait on its followers.
func (h *Hub) Close() { h.once.Do(func() { close(h.done) }) }

// ServeHTTP streams the counts: a snapshot, then every change, until the
// follower goes away, falls behind by WriteTimeout, or the hub closes. One
// loop, so that a follower's whole stream, and every way it ends, read in
// one place.
func (h *Hub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	f := &follower{wake: make(chan struct{}, 1), dirty: make(map[*fleet.Backend]struct{})}
	if !h.add(f) {
		http.Error(w, "too many followers, or shutting down", http.StatusServiceUnavailable)
		return
	}
	defer h.remove(f)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	write := func(u *Update) bool {
		buf.Reset()
		enc.Encode(u) // cannot fail: strings and integers
		rc.SetWriteDeadline(h.o.Now().Add(h.o.WriteTimeout))
		_, err := w.Write(buf.Bytes())
		if err == nil {
			err = rc.Flush()
		}
		// A failed write cancels the request's context too: only the
		// deadline tells a follower too slow from one gone.
		if errors.Is(err, os.ErrDeadlineExceeded) {
			h.dropped.Inc()
			h.log.Info("peers: follower dropped", "peer", r.RemoteAddr, "err", err)
		}
		return err == nil
	}

	// f was added before the snapshot is read: a change after the read
	// is in f.dirty and sent after it, one before is in the snapshot.
	snap := Snapshot(h.id, h.backends())
	if !write(&Update{Replica: snap.Replica, Full: true, Backends: snap.Backends}) {
		return
	}
	beat := time.NewTicker(h.o.Heartbeat)
	defer beat.Stop()
	spare := make(map[*fleet.Backend]struct{})
	var u Update
	for {
		select {
		case <-r.Context().Done():
			return
		case <-h.done:
			return
		case <-beat.C:
			if !write(&Update{}) {
				return
			}
		case <-f.wake:
			h.mu.Lock()
			dirty, since := f.dirty, f.since
			f.dirty = spare
			h.mu.Unlock()
			// The counts are read now, after the set was taken: a change
			// racing this read is marked again and sent in the next line.
			// A removed backend still reports as its last requests end;
			// should one with its URL have been added since, the next
			// change of the new one puts its counts back.
			u = Update{Backends: make(map[string]Counts, len(dirty)), Changed: since.UnixNano()}
			for b := range dirty {
				if b.URL != nil {
					u.Backends[b.URL.String()] = countsOf(b.Load())
				}
			}
			clear(dirty)
			spare = dirty // the two sets take turns: one marked, one written
			if len(u.Backends) == 0 {
				continue
			}
			if !write(&u) {
				return
			}
			h.sent.Inc()
			beat.Reset(h.o.Heartbeat)
		}
	}
}

func (h *Hub) add(f *follower) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.done:
		return false
	default:
	}
	if len(h.subs) >= h.o.MaxSubscribers {
		return false
	}
	h.subs[f] = struct{}{}
	h.n.Store(int32(len(h.subs)))
	h.subscribers.Set(float64(len(h.subs)))
	return true
}

func (h *Hub) remove(f *follower) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, f)
	h.n.Store(int32(len(h.subs)))
	h.subscribers.Set(float64(len(h.subs)))
}

func countsOf(l fleet.Load) Counts {
	return Counts{Requests: l.Requests, PrefillTokens: l.PrefillTokens, Decoding: l.Decoding, DecodeTokens: l.DecodeTokens}
}
