package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Defaults for a subscriber, flags of kvroute serve.
const (
	// DefaultReplayTimeout bounds one replay request: vLLM answers from an
	// in-memory buffer of 10,000 batches, in milliseconds.
	DefaultReplayTimeout = 2 * time.Second
	// DefaultRetry is the wait before reconnecting to a publisher that is
	// down or restarting.
	DefaultRetry = time.Second
	// DefaultProbe is the quiet spell after which the replay socket is
	// asked for anything past the last batch applied, then again after
	// twice as long, and so on up to maxProbe. A lost batch is noticed
	// when the next one arrives; the last one before a lull (published
	// while a new subscription was still reaching the engine, or dropped
	// past the PUB socket's high-water mark) would otherwise stay missing
	// until traffic resumes, and a router would price the first requests
	// after the lull on a stale cache. A second is longer than the gap
	// between batches of an engine under load, so a busy engine is never
	// probed and an idle one a few times a minute at most.
	DefaultProbe = time.Second
	// maxProbe caps the doubling of the quiet spell between probes
	// (unless the probe itself is longer): a batch lost in a long lull is
	// found within a minute.
	maxProbe = time.Minute
)

// Source is one backend's KV event stream (vLLM's --kv-events-config:
// endpoint, replay_endpoint, topic).
type Source struct {
	// Backend is the backend's index in the Store (fleet.Backend.Index).
	Backend int
	// Name labels the backend's logs and metrics.
	Name string
	// Endpoint is the engine's PUB socket, e.g. tcp://10.0.0.5:5557.
	Endpoint string
	// Replay is its ROUTER replay socket ("" if it has none): missed
	// batches are asked for there.
	Replay string
	// Topic is the topic the engine publishes on ("" matches any).
	Topic string
}

// Subscriber follows one Source into a Store. Run it in a goroutine of its
// own; it is not safe for concurrent use.
type Subscriber struct {
	src           Source
	store         *Store
	metrics       *Metrics
	log           *slog.Logger
	replayTimeout time.Duration
	retry         time.Duration
	probe         time.Duration
	now           func() time.Time

	// last is the sequence number of the last batch applied, -1 before
	// any; afterReplay says that batches up to last may still arrive live
	// (they were queued while the replay ran) and are duplicates, not a
	// restart.
	last        int64
	afterReplay bool
	// heard is when the last batch came or the last probe was made;
	// wait is the quiet spell from then before the next probe.
	heard time.Time
	wait  time.Duration
}

// SubscriberOptions tune a Subscriber; zero values take the defaults.
type SubscriberOptions struct {
	ReplayTimeout time.Duration
	Retry         time.Duration
	// Probe is the quiet spell after which the replay socket is asked
	// for batches past the last one applied (DefaultProbe); negative:
	// never.
	Probe   time.Duration
	Metrics *Metrics
	Log     *slog.Logger
	// Now is the clock the lag is measured by; nil means time.Now.
	Now func() time.Time
}

// NewSubscriber returns a subscriber of src feeding store.
func NewSubscriber(src Source, store *Store, o SubscriberOptions) *Subscriber {
	s := &Subscriber{src: src, store: store, metrics: o.Metrics, log: o.Log, now: o.Now,
		replayTimeout: o.ReplayTimeout, retry: o.Retry, probe: o.Probe, last: -1}
	if s.replayTimeout <= 0 {
		s.replayTimeout = DefaultReplayTimeout
	}
	if s.retry <= 0 {
		s.retry = DefaultRetry
	}
	if s.probe == 0 {
		s.probe = DefaultProbe
	}
	s.wait = s.probe
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.log = s.log.With("backend", src.Name, "endpoint", src.Endpoint)
	return s
}

// quiet keeps zmq4's own logging (to stderr, by default) out of ours.
var quiet = log.New(io.Discard, "", 0)

// Run follows the stream until ctx is done, reconnecting after every
// failure; while it is not connected the backend's state is Unknown.
func (s *Subscriber) Run(ctx context.Context) {
	for ctx.Err() == nil {
		connected, err := s.session(ctx)
		s.store.SetState(s.src.Backend, Unknown)
		s.status()
		if ctx.Err() != nil {
			return
		}
		// On the transition only: an engine that stays down is tried
		// every retry without a line each time.
		if connected {
			s.log.Warn("kv events: disconnected; the index decides until reconnected", "err", err, "retry", s.retry)
		} else {
			s.log.Debug("kv events: cannot connect", "err", err, "retry", s.retry)
		}
		t := time.NewTimer(s.retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// session connects, catches up from the replay socket and applies live
// batches until the connection fails; it reports whether it connected.
func (s *Subscriber) session(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(ctx, zmq4.WithLogger(quiet), zmq4.WithDialerMaxRetries(0))
	defer sub.Close()
	if err := sub.Dial(s.src.Endpoint); err != nil {
		return false, err
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, s.src.Topic); err != nil {
		return false, err
	}
	s.last, s.afterReplay = -1, false
	s.store.Reset(s.src.Backend, Unknown)
	s.metrics.reset(s.src.Name, "connect")
	if s.src.Replay != "" {
		// Whatever the engine published before we connected: from its
		// first batch if the buffer still holds it.
		s.catchUp(ctx, 0, -1)
	}
	s.log.Info("kv events: connected", "state", s.state())
	s.heard, s.wait = s.now(), s.probe
	msgs, failed := make(chan zmq4.Msg), make(chan error, 1)
	go func() {
		for {
			msg, err := sub.Recv()
			if err != nil {
				failed <- err
				return
			}
			select {
			case msgs <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	var lull <-chan time.Time
	var t *time.Timer
	if s.probe > 0 && s.src.Replay != "" {
		t = time.NewTimer(s.probe)
		defer t.Stop()
		lull = t.C
	}
	for {
		select {
		case msg := <-msgs:
			if err := s.handle(ctx, msg.Frames); err != nil {
				s.log.Warn("kv events: bad message", "err", err)
			}
			if t != nil {
				t.Reset(s.wait)
			}
		case <-lull:
			s.probeTail(ctx)
			t.Reset(s.wait)
		case err := <-failed:
			return true, err
		case <-ctx.Done():
			return true, ctx.Err()
		}
	}
}

// handle applies one live message: [topic, sequence number, payload].
func (s *Subscriber) handle(ctx context.Context, frames [][]byte) error {
	if len(frames) != 3 || len(frames[1]) != 8 {
		return fmt.Errorf("%w: %d frames", ErrFormat, len(frames))
	}
	seq := int64(binary.BigEndian.Uint64(frames[1]))
	switch {
	case s.last >= 0 && seq <= s.last && s.afterReplay:
		return nil // already applied from the replay
	case s.last >= 0 && seq <= s.last:
		// Sequence numbers start at 0 with every engine process: this is
		// a new one, with an empty cache.
		s.log.Info("kv events: the engine restarted", "seq", seq, "last", s.last)
		s.metrics.reset(s.src.Name, "restart")
		s.store.Reset(s.src.Backend, Unknown)
		s.last = -1
	}
	s.afterReplay = false
	s.heard, s.wait = s.now(), s.probe
	if seq > s.last+1 {
		s.recover(ctx, seq)
	}
	b, err := Decode(frames[2])
	if err != nil {
		return err
	}
	s.apply(seq, &b, false)
	return nil
}

// recover fills the batches before seq that never arrived from the replay
// socket; what it cannot fill resets the backend's state, partial from here
// on. Sequence 0 first: a stream joined after it started is partial until
// recovered.
func (s *Subscriber) recover(ctx context.Context, seq int64) {
	from := s.last + 1
	if s.last >= 0 {
		s.metrics.gap(s.src.Name, seq-from)
		s.log.Info("kv events: gap", "from", from, "to", seq-1)
	}
	if s.src.Replay != "" && s.catchUp(ctx, from, seq) {
		if from == 0 {
			s.store.SetState(s.src.Backend, Exact) // every batch from the first
		}
		return
	}
	if s.last >= 0 {
		s.metrics.reset(s.src.Name, "gap")
	}
	s.store.Reset(s.src.Backend, Partial)
	s.last = seq - 1
}

// probeTail asks the replay socket for the batches past the last one
// applied, after a quiet spell (see DefaultProbe). Batches after a hole in
// the replay reset the state to partial, as a live gap does.
func (s *Subscriber) probeTail(ctx context.Context) {
	if s.src.Replay == "" {
		return
	}
	defer func() { s.heard, s.wait = s.now(), min(2*s.wait, max(s.probe, maxProbe)) }()
	last, after := s.last, s.afterReplay
	whole := s.catchUp(ctx, last+1, -1)
	switch {
	case s.last == last:
		// Nothing was missing, or the replay failed (logged): no live
		// batch is a duplicate of a replayed one.
		s.afterReplay = after
		if whole {
			s.metrics.probe(s.src.Name, "current")
		} else {
			s.metrics.probe(s.src.Name, "failed")
		}
	case whole:
		s.log.Info("kv events: recovered batches lost before a quiet spell", "from", last+1, "to", s.last)
		s.metrics.probe(s.src.Name, "recovered")
	default:
		s.metrics.probe(s.src.Name, "gap")
		if last >= 0 {
			s.log.Info("kv events: gap", "from", last+1, "upto", s.last)
			s.metrics.reset(s.src.Name, "gap")
			s.store.Reset(s.src.Backend, Partial)
		}
	}
	s.status()
}

// apply applies batch seq to the store.
func (s *Subscriber) apply(seq int64, b *Batch, replayed bool) {
	s.store.Apply(s.src.Backend, b)
	if s.last < 0 && seq == 0 {
		s.store.SetState(s.src.Backend, Exact) // every batch from the first
	} else if s.state() == Unknown {
		s.store.SetState(s.src.Backend, Partial)
	}
	s.last = seq
	lag := 0.0
	if b.TS > 0 {
		lag = max(0, float64(s.now().UnixNano())/1e9-b.TS)
	}
	s.metrics.batch(s.src.Name, b, lag, replayed)
	s.status()
}

func (s *Subscriber) state() State {
	st, _ := s.store.Status(s.src.Backend)
	return st
}

func (s *Subscriber) status() {
	s.metrics.status(s.src.Name, s.state(), s.store.Blocks(s.src.Backend, MediumGPU), s.store.Blocks(s.src.Backend, MediumCPU))
}

// endSeq is the replay's end marker: sequence number -1.
const endSeq = -1

// replayFrames reads one replay answer as a DEALER receives it: the empty
// delimiter, then [sequence number, batch] (vLLM), or [topic, sequence
// number, batch] (llm-d's simulator); the end marker has an empty batch.
func replayFrames(f [][]byte) (int64, []byte, error) {
	if len(f) > 0 && len(f[0]) == 0 {
		f = f[1:]
	}
	if len(f) < 2 || len(f) > 3 || len(f[len(f)-2]) != 8 {
		return 0, nil, fmt.Errorf("%w: a replay message of %d frames", ErrFormat, len(f))
	}
	return int64(binary.BigEndian.Uint64(f[len(f)-2])), f[len(f)-1], nil
}

// catchUp asks the replay socket for the batches from from on and applies
// those before upto (all of them if upto < 0), and reports whether they
// were all there, without a hole.
func (s *Subscriber) catchUp(ctx context.Context, from, upto int64) bool {
	ctx, cancel := context.WithTimeout(ctx, s.replayTimeout)
	defer cancel()
	// A DEALER, not vLLM's example's REQ: the ROUTER answers one request
	// with many messages, which a REQ socket would drop after the first.
	d := zmq4.NewDealer(ctx, zmq4.WithLogger(quiet), zmq4.WithDialerMaxRetries(0))
	defer d.Close()
	err := d.Dial(s.src.Replay)
	if err == nil {
		var req [8]byte
		binary.BigEndian.PutUint64(req[:], uint64(from))
		// The empty delimiter a REQ socket would add: vLLM's ROUTER reads
		// [identity, "", start].
		err = d.Send(zmq4.NewMsgFrom([]byte{}, req[:]))
	}
	next, whole, first := from, true, true
	for err == nil {
		var msg zmq4.Msg
		if msg, err = d.Recv(); err != nil {
			break
		}
		var seq int64
		var payload []byte
		if seq, payload, err = replayFrames(msg.Frames); err != nil {
			break
		}
		if seq == endSeq {
			break
		}
		if first && from == 0 && seq == 1 {
			// A publisher that numbers from 1 (llm-d's simulator): its
			// first batch is the start.
			next = 1
		}
		first = false
		if seq < next || (upto >= 0 && seq >= upto) {
			continue
		}
		whole = whole && seq == next
		b, derr := Decode(payload)
		if derr != nil {
			whole = false
			continue
		}
		s.apply(seq, &b, true)
		next = seq + 1
	}
	if err != nil {
		s.log.Warn("kv events: replay failed", "replay", s.src.Replay, "from", from, "err", err)
		return false
	}
	s.afterReplay = true
	if upto < 0 {
		// The whole buffer: from the engine's first batch (or it has
		// published none: its cache is empty). From a later batch (a
		// probe), the state stays what it was.
		if whole && from == 0 {
			s.store.SetState(s.src.Backend, Exact)
		}
		if next == from && from == 0 {
			s.last = -1
		}
		return whole
	}
	return whole && next == upto
}
