package kvevents

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Listener binds one SUB socket that many engines connect to, and feeds
// each engine's batches, told apart by their topic, to a stream of its own:
// the other way round from Subscriber. llm-d's simulator dials its
// --zmq-endpoint and names itself in its topic (kv@POD_IP@MODEL); vLLM
// connects too when its endpoint names a host rather than *. Run it in a
// goroutine of its own.
type Listener struct {
	sub      zmq4.Socket
	endpoint string
	// resolve names the backend whose engine publishes on topic; false
	// drops the topic's batches (an engine not, or no longer, in the
	// fleet).
	resolve func(topic string) (Source, bool)
	store   *Store
	opts    SubscriberOptions
	log     *slog.Logger
	streams map[string]*Subscriber
}

// Listen binds endpoint (e.g. tcp://*:5557) until ctx is done and returns
// a listener feeding store, each topic's backend named by resolve. Run
// receives.
func Listen(ctx context.Context, endpoint string, resolve func(topic string) (Source, bool), store *Store, o SubscriberOptions) (*Listener, error) {
	l := &Listener{endpoint: endpoint, resolve: resolve, store: store, opts: o, log: o.Log, streams: make(map[string]*Subscriber)}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.sub = zmq4.NewSub(ctx, zmq4.WithLogger(quiet))
	if err := l.sub.Listen(endpoint); err != nil {
		l.sub.Close()
		return nil, err
	}
	if err := l.sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		l.sub.Close()
		return nil, err
	}
	return l, nil
}

// Addr returns the bound address (its port when bound to 0).
func (l *Listener) Addr() net.Addr { return l.sub.Addr() }

// Run receives until ctx is done, then closes the socket.
func (l *Listener) Run(ctx context.Context) {
	defer l.sub.Close()
	l.log.Info("kv events: listening", "endpoint", l.endpoint)
	msgs := make(chan zmq4.Msg)
	go func() {
		for {
			msg, err := l.sub.Recv()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue // one engine's connection failed; the others go on
			}
			select {
			case msgs <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	// Each stream's quiet spell, checked a few times the shortest.
	var lulls <-chan time.Time
	if probe := l.probe(); probe > 0 {
		t := time.NewTicker(probe / 4)
		defer t.Stop()
		lulls = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-lulls:
			for _, s := range l.streams {
				if s.now().Sub(s.heard) >= s.wait {
					s.probeTail(ctx)
				}
			}
		case msg := <-msgs:
			if len(msg.Frames) == 0 {
				continue
			}
			if s := l.stream(string(msg.Frames[0])); s != nil {
				if err := s.handle(ctx, msg.Frames); err != nil {
					l.log.Warn("kv events: bad message", "topic", string(msg.Frames[0]), "err", err)
				}
			}
		}
	}
}

// probe is the streams' quiet spell; 0: they are not probed.
func (l *Listener) probe() time.Duration {
	switch {
	case l.opts.Probe < 0:
		return 0
	case l.opts.Probe == 0:
		return DefaultProbe
	}
	return l.opts.Probe
}

// stream returns the stream of topic's engine, a new one for an engine
// not heard from or that stands for another backend now; nil when the
// topic names no backend of the fleet.
func (l *Listener) stream(topic string) *Subscriber {
	src, ok := l.resolve(topic)
	if !ok {
		return nil
	}
	s := l.streams[topic]
	if s == nil || s.src.Backend != src.Backend {
		s = NewSubscriber(src, l.store, l.opts)
		l.store.Reset(src.Backend, Unknown)
		l.streams[topic] = s
	}
	return s
}

// TopicHost returns the host an llm-d-style topic names: kv@HOST@MODEL.
func TopicHost(topic string) (string, bool) {
	parts := strings.Split(topic, "@")
	if len(parts) < 3 || parts[1] == "" {
		return "", false
	}
	return parts[1], true
}
