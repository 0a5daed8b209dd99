package kvevents

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// waitFor polls cond until it holds: the subscriber runs on real sockets,
// whose delivery has no event to wait on. It fails after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func block(hash uint64, parent uint64, tokens ...int32) Event {
	return Event{Kind: BlockStored, Hashes: []uint64{hash}, Parent: parent, HasParent: parent != 0,
		Tokens: tokens, BlockSize: len(tokens), Medium: MediumGPU}
}

func startPublisher(t *testing.T, endpoint, replay string) *Publisher {
	t.Helper()
	p, err := NewPublisher(PublisherConfig{Endpoint: endpoint, Replay: replay, Topic: "kv@test"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSubscriberOverZMQ runs a publisher and a subscriber on 127.0.0.1:
// the batches published before the subscriber joined come by replay, a
// message the PUB socket lost is replayed, one lost beyond the replay
// buffer resets the state to partial, and a restarted publisher (sequence
// numbers from 0 again) clears it.
func TestSubscriberOverZMQ(t *testing.T) {
	pub := startPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	endpoint, replay := "tcp://"+pub.Addr().String(), "tcp://"+pub.ReplayAddr().String()
	mustPublish := func(p *Publisher, evs ...Event) {
		t.Helper()
		if _, err := p.Publish(Batch{TS: 1, Events: evs}); err != nil {
			t.Fatal(err)
		}
	}
	mustPublish(pub, block(11, 0, 1, 2)) // before anyone listens

	store := NewStore(KeyTokens)
	ctx, cancel := context.WithCancel(context.Background())
	sub := NewSubscriber(Source{Backend: 0, Name: "b0", Endpoint: endpoint, Replay: replay, Topic: "kv@"}, store,
		SubscriberOptions{Retry: 20 * time.Millisecond})
	done := make(chan struct{})
	go func() { sub.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; pub.Close() }()

	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8}
	match := func() (State, int) {
		st, _, gpu, _ := store.Match(0, func(bs int) []uint64 { return TokenChain(nil, prompt, bs) })
		return st, gpu
	}
	waitFor(t, "the replayed first block", func() bool { st, n := match(); return st == Exact && n == 1 })

	// Live batches; the subscriber may still be joining, so publish until
	// one arrives (a lost one is a gap, replayed).
	waitFor(t, "a live batch", func() bool {
		mustPublish(pub)
		return store.Blocks(0, MediumGPU) == 1 && func() bool { st, _ := store.Status(0); return st == Exact }()
	})
	mustPublish(pub, block(12, 11, 3, 4))
	waitFor(t, "the second block", func() bool { st, n := match(); return st == Exact && n == 2 })

	// A batch the PUB socket lost: the next one reveals the gap; replay
	// recovers it.
	pub.Lose(Batch{TS: 1, Events: []Event{block(13, 12, 5, 6)}})
	mustPublish(pub, block(14, 13, 7, 8))
	waitFor(t, "the lost block, replayed", func() bool { st, n := match(); return st == Exact && n == 4 })

	// One lost beyond recovery: the state is dropped and partial.
	pub.Skip()
	mustPublish(pub, Event{Kind: BlockRemoved, Hashes: []uint64{14}, Medium: MediumGPU})
	waitFor(t, "a reset to partial", func() bool { st, n := match(); return st == Partial && n == 0 })

	// A restart: a new publisher on the same ports numbers from 0.
	pub.Close()
	pub = startPublisher(t, endpoint, replay)
	waitFor(t, "the restarted engine's first block", func() bool {
		mustPublish(pub, block(21, 0, 1, 2))
		st, n := match()
		return st == Exact && n == 1
	})
	if n := store.Blocks(0, MediumGPU); n != 1 {
		t.Fatalf("after the restart the store holds %d blocks, want 1 (the old ones cleared)", n)
	}
}

// TestProbeRecoversTheLastBatch loses the last batch before a lull, as
// ZMQ's late joiner or the PUB socket's high-water mark does: no later
// batch reveals the gap, so only the probe after the quiet spell recovers
// it from the replay socket. A lull with nothing missing changes nothing.
func TestProbeRecoversTheLastBatch(t *testing.T) {
	pub := startPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	defer pub.Close()
	store, m := NewStore(KeyTokens), NewMetrics()
	ctx, cancel := context.WithCancel(context.Background())
	sub := NewSubscriber(Source{Backend: 0, Name: "b0", Endpoint: "tcp://" + pub.Addr().String(),
		Replay: "tcp://" + pub.ReplayAddr().String(), Topic: "kv@"}, store,
		SubscriberOptions{Retry: 20 * time.Millisecond, Probe: 20 * time.Millisecond, Metrics: m})
	done := make(chan struct{})
	go func() { sub.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// Live batches until one arrives (the subscription may still be on
	// its way; a lost one is recovered either way).
	waitFor(t, "a live batch", func() bool {
		if _, err := pub.Publish(Batch{TS: 1}); err != nil {
			t.Fatal(err)
		}
		return testutil.ToFloat64(m.batches.WithLabelValues("b0")) > testutil.ToFloat64(m.replayed.WithLabelValues("b0"))
	})
	if _, err := pub.Publish(Batch{TS: 1, Events: []Event{block(11, 0, 1, 2)}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first block", func() bool { return store.Blocks(0, MediumGPU) == 1 })
	waitFor(t, "a probe of a lull with nothing missed", func() bool {
		return testutil.ToFloat64(m.probes.WithLabelValues("b0", "current")) > 0
	})

	// A probe can also count as recovered a batch it replayed while the
	// same batch was still on its way live (a publication in the quiet
	// spell of a loaded machine): count from here.
	probed := func(result string) float64 { return testutil.ToFloat64(m.probes.WithLabelValues("b0", result)) }
	recovered, gaps := probed("recovered"), probed("gap")
	pub.Lose(Batch{TS: 1, Events: []Event{block(12, 11, 3, 4)}})
	// The probe applies the replayed batch, then, once the replay has
	// ended, counts its result: wait for the count, not for the block.
	waitFor(t, "a probe that finds the lost last block", func() bool { return probed("recovered")+probed("gap") > recovered+gaps })
	if got := probed("recovered") - recovered; got != 1 {
		t.Fatalf("%v probes recovered batches, %v found a gap; want 1 recovered", got, probed("gap")-gaps)
	}
	if st, _ := store.Status(0); st != Exact || store.Blocks(0, MediumGPU) != 2 {
		t.Fatalf("state %v with %d blocks after the recovery, want exact with 2", st, store.Blocks(0, MediumGPU))
	}
}
