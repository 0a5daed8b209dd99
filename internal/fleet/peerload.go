package fleet

import "time"

// PeerLoad is the work other router replicas said they have in flight on a
// backend, summed over them, as of At (when the oldest of the reports that
// went into it was taken). Each replica counts only what it sent; a replica
// that knows what the others sent sees the backend's whole load instead of
// guessing it as its own share times the number of replicas.
type PeerLoad struct {
	Load
	// Peers is the number of replicas whose reports are in the sum.
	Peers int
	At    time.Time
}

// Plus returns the sum of two loads.
func (l Load) Plus(o Load) Load {
	return Load{
		Requests:      l.Requests + o.Requests,
		PrefillTokens: l.PrefillTokens + o.PrefillTokens,
		Decoding:      l.Decoding + o.Decoding,
		DecodeTokens:  l.DecodeTokens + o.DecodeTokens,
	}
}

// Minus returns l less o.
func (l Load) Minus(o Load) Load {
	return Load{
		Requests:      l.Requests - o.Requests,
		PrefillTokens: l.PrefillTokens - o.PrefillTokens,
		Decoding:      l.Decoding - o.Decoding,
		DecodeTokens:  l.DecodeTokens - o.DecodeTokens,
	}
}

// PeerLoad returns what the other replicas last reported, or nil before any
// report or when it is older than maxAge at now: a stale count of another
// replica's work is worse than none, since that work has long finished or
// grown.
func (b *Backend) PeerLoad(now time.Time, maxAge time.Duration) *PeerLoad {
	p := b.peerLoad.Load()
	if p == nil || now.Sub(p.At) > maxAge {
		return nil
	}
	return p
}

// SetPeerLoad records the other replicas' reports; nil forgets them.
func (b *Backend) SetPeerLoad(p *PeerLoad) {
	b.peerLoad.Store(p)
	if fn := b.onPeerLoad.Load(); fn != nil {
		(*fn)(b)
	}
}

// WatchPeerLoad makes fn be called with b after every SetPeerLoad, on the
// goroutine that called it; nil stops it. Pushed reports arrive one
// backend at a time, so a router that keeps backends ordered by their
// whole load must hear of each (kvroute's pruned pick). fn must be cheap
// and must never call SetPeerLoad. One watcher per backend: a second call
// replaces the first.
func (b *Backend) WatchPeerLoad(fn func(*Backend)) {
	if fn == nil {
		b.onPeerLoad.Store(nil)
		return
	}
	b.onPeerLoad.Store(&fn)
}
