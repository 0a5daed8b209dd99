package kvevents

import (
	"context"
	"encoding/binary"
	"net"
	"sync"

	"github.com/go-zeromq/zmq4"
)

// DefaultBufferSteps is how many past batches a Publisher keeps for
// replay: vLLM's buffer_steps default.
const DefaultBufferSteps = 10_000

// PublisherConfig is where and how a Publisher publishes: the essence of
// vLLM's --kv-events-config (endpoint, replay_endpoint, topic,
// buffer_steps).
type PublisherConfig struct {
	// Endpoint is the PUB socket to bind, e.g. tcp://*:5557, or with
	// Connect the subscriber's socket to connect to.
	Endpoint string
	// Connect connects the PUB socket to Endpoint instead of binding it:
	// vLLM does so when its endpoint names a host, and llm-d's simulator
	// always, towards a router that binds (Listener).
	Connect bool
	// Replay is the ROUTER socket to bind for replay requests; "" for none.
	Replay string
	// Topic is the first frame of every message.
	Topic string
	// Format is the batches' msgpack layout (FormatMap, as vLLM now).
	Format Format
	// BufferSteps is how many past batches replay can resend (default
	// DefaultBufferSteps).
	BufferSteps int
}

// Publisher publishes KV event batches as vLLM's ZmqEventPublisher does:
// each a message [topic, sequence number as 8 bytes big-endian, msgpack
// batch] on a PUB socket, numbered from 0; a ROUTER socket answers a
// request [start as 8 bytes] with every buffered batch from start on,
// each [sequence number, batch], then [-1, ""]. It is safe for concurrent
// use.
type Publisher struct {
	cfg    PublisherConfig
	cancel context.CancelFunc
	pub    zmq4.Socket
	router zmq4.Socket
	done   chan struct{}

	mu  sync.Mutex
	seq int64
	buf []sent // a ring of the last BufferSteps batches
	// oldest is buf's oldest batch once it is full.
	oldest int
}

type sent struct {
	seq     int64
	payload []byte
}

// NewPublisher binds cfg's sockets and starts answering replay requests.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = DefaultBufferSteps
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{cfg: cfg, cancel: cancel, done: make(chan struct{})}
	var open func(string) error
	if cfg.Connect {
		// Reconnecting is for a connecting socket only: zmq4 would redial
		// a bound one's endpoint when a subscriber leaves.
		p.pub = zmq4.NewPub(ctx, zmq4.WithLogger(quiet), zmq4.WithDialerMaxRetries(-1), zmq4.WithAutomaticReconnect(true))
		open = p.pub.Dial
	} else {
		p.pub = zmq4.NewPub(ctx, zmq4.WithLogger(quiet))
		open = p.pub.Listen
	}
	if err := open(cfg.Endpoint); err != nil {
		cancel()
		p.pub.Close()
		return nil, err
	}
	if cfg.Replay == "" {
		close(p.done)
		return p, nil
	}
	p.router = zmq4.NewRouter(ctx, zmq4.WithLogger(quiet))
	if err := p.router.Listen(cfg.Replay); err != nil {
		cancel()
		p.pub.Close()
		p.router.Close()
		return nil, err
	}
	go p.serveReplay()
	return p, nil
}

// Addr returns the PUB socket's address (its port when bound to 0); nil
// when it connects.
func (p *Publisher) Addr() net.Addr {
	if p.cfg.Connect {
		return nil
	}
	return p.pub.Addr()
}

// ReplayAddr returns the replay socket's address, nil without one.
func (p *Publisher) ReplayAddr() net.Addr {
	if p.router == nil {
		return nil
	}
	return p.router.Addr()
}

// Publish numbers b, sends it and keeps it for replay. It returns the
// sequence number.
func (p *Publisher) Publish(b Batch) (int64, error) {
	payload := Encode(nil, b, p.cfg.Format)
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	p.seq++
	p.keep(seq, payload)
	// Sent under the lock so that messages leave in sequence order.
	return seq, p.pub.Send(zmq4.NewMsgFrom([]byte(p.cfg.Topic), seqBytes(seq), payload))
}

// Published returns how many sequence numbers the publisher has used.
func (p *Publisher) Published() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// Lose numbers b and keeps it for replay without sending it: a message
// the PUB socket dropped (past its high-water mark, or before the
// subscriber joined), which replay recovers.
func (p *Publisher) Lose(b Batch) {
	payload := Encode(nil, b, p.cfg.Format)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keep(p.seq, payload)
	p.seq++
}

// Skip consumes a sequence number without sending or keeping a batch: a
// message lost beyond recovery.
func (p *Publisher) Skip() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
}

// keep buffers batch seq for replay. Call with mu held.
func (p *Publisher) keep(seq int64, payload []byte) {
	if len(p.buf) < p.cfg.BufferSteps {
		p.buf = append(p.buf, sent{seq, payload})
		return
	}
	p.buf[p.oldest] = sent{seq, payload}
	p.oldest = (p.oldest + 1) % len(p.buf)
}

func seqBytes(seq int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(seq)) }

// serveReplay answers replay requests until Close.
func (p *Publisher) serveReplay() {
	defer close(p.done)
	for {
		msg, err := p.router.Recv()
		if err != nil {
			return // closed
		}
		f := msg.Frames // [identity, "", start]
		if len(f) != 3 || len(f[2]) != 8 {
			continue
		}
		id, start := f[0], int64(binary.BigEndian.Uint64(f[2]))
		for _, s := range p.since(start) {
			if p.router.Send(zmq4.NewMsgFrom(id, nil, seqBytes(s.seq), s.payload)) != nil {
				break
			}
		}
		_ = p.router.Send(zmq4.NewMsgFrom(id, nil, seqBytes(endSeq), nil))
	}
}

// since returns the buffered batches from start on, in order.
func (p *Publisher) since(start int64) []sent {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []sent
	for i := range p.buf {
		s := p.buf[(p.oldest+i)%len(p.buf)]
		if s.seq >= start {
			out = append(out, s)
		}
	}
	return out
}

// Close closes the sockets and waits for the replay server to stop.
func (p *Publisher) Close() error {
	p.cancel()
	err := p.pub.Close()
	if p.router != nil {
		p.router.Close()
	}
	<-p.done
	return err
}
