package fleet

import (
	"context"
	"time"
)

// Watch registers fn to be told the fleet's new set of backends, in fleet
// order, whenever Update changes it. fn runs inside Update before the new
// set is published, so that a policy has grown its per-backend state before
// any new backend can be a candidate; it must not call back into Update.
// One watcher per fleet: a second call replaces the first.
func (f *Fleet) Watch(fn func(backends []*Backend)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watch = fn
}

// WatchLoad makes fn the load watcher (Backend.WatchLoad) of every backend
// of the fleet, and of every backend Update adds from now on; nil stops
// it for the backends to come. A removed backend keeps it: its requests
// still in flight change its counts as they end.
func (f *Fleet) WatchLoad(fn func(*Backend)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watchLoad = fn
	for _, b := range f.set.Load().backends {
		b.WatchLoad(fn)
	}
}

// identity is what makes a backend the same one across updates: its name,
// its URL and the key it is sent. A backend whose URL or key changes is a
// new backend that starts cold.
func identity(b *Backend) string {
	return b.Name + "\x00" + endpoint(b) + "\x00" + string(b.APIKey) + "\x00" + b.Role().String() // a relabelled pod takes another part
}

// Update makes backends the fleet's members, in that order, and returns the
// backends it added and removed.
//
// A backend already in the fleet (same name, URL and API key) is kept as it
// is, with its health, metrics and ejections; the *Backend given for it is
// ignored. A new one gets the next Index (indexes only grow and are never
// reused, so Update overwrites the Index of the backends it adds), starts
// out of rotation, and is probed, scraped and discovered before Update
// returns: it becomes a candidate as soon as its first health check passes.
// One that fails that check is left to the health loop. A removed backend
// is out of rotation at once; requests already routed to it finish
// normally (their tickets hold the *Backend), and its health, metrics and
// ejection state are dropped: reports about it are ignored from now on.
// Backends with a name or URL already given earlier in the list are
// skipped with a warning.
//
// Update is safe for concurrent use with everything else; concurrent
// Updates are serialised. The probes of new backends are bounded by the
// probe timeout and by ctx.
func (f *Fleet) Update(ctx context.Context, backends []*Backend) (added, removed []*Backend) {
	f.mu.Lock()
	defer f.mu.Unlock()
	old := f.set.Load()
	have := make(map[string]*member, len(old.members))
	for _, m := range old.members {
		have[identity(m.b)] = m
	}
	next := &memberSet{byPtr: make(map[*Backend]*member, len(backends))}
	names, urls := make(map[string]bool, len(backends)), make(map[string]bool, len(backends))
	var fresh []*member
	for _, b := range backends {
		u := endpoint(b) // rank.go: ranks share a URL
		if names[b.Name] || urls[u] {
			f.log.Warn("backend given twice; ignoring the second", "backend", b.Name, "url", u)
			continue
		}
		names[b.Name], urls[u] = true, true
		if m := have[identity(b)]; m != nil {
			delete(have, identity(b))
			next.add(m)
			continue
		}
		b.Index = f.next
		f.next++
		b.SetHealthy(false) // not a candidate until a health check passes
		if f.watchLoad != nil {
			b.WatchLoad(f.watchLoad)
		}
		m := newMember(b)
		next.add(m)
		fresh = append(fresh, m)
	}
	if len(fresh) == 0 && len(have) == 0 {
		return nil, nil
	}
	if f.watch != nil {
		f.watch(next.backends)
	}
	f.set.Store(next)
	f.out.resize(len(next.members))
	for _, m := range old.members { // in fleet order, for the logs
		if have[identity(m.b)] != m {
			continue
		}
		f.drop(m)
		removed = append(removed, m.b)
		f.log.Info("backend removed", "backend", m.b.Name, "url", m.base, "in_flight", m.b.Load().Requests)
	}
	for _, m := range fresh {
		added = append(added, m.b)
	}
	f.admit(ctx, fresh)
	return added, removed
}

// drop forgets removed member m's state: it leaves rotation, gives back its
// ejection slot and is no longer probed or scraped (the loops read the new
// set). Its in-flight counts stay on the Backend, released by the tickets.
func (f *Fleet) drop(m *member) {
	m.b.SetHealthy(false)
	o := &m.out
	o.mu.Lock()
	o.removed = true
	if o.ejected.Load() {
		o.ejected.Store(false)
		f.out.ejected.Add(-1)
	}
	o.mu.Unlock()
	m.b.SetMetrics(nil)
}

// admit probes the new members in parallel and brings into rotation those
// that pass, scraped and discovered, so that they can be routed to at once
// rather than a health interval later. One probe is enough, as for the
// backends given to New, which start healthy.
func (f *Fleet) admit(ctx context.Context, ms []*member) {
	f.each(ms, func(m *member) {
		started := f.now()
		err := f.probe(ctx, m)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			m.mu.Lock()
			m.fails++
			m.mu.Unlock()
			f.log.Warn("backend added, not reachable yet", "backend", m.b.Name, "url", m.base, "err", err)
			return
		}
		f.scrape(ctx, m)
		f.discover(ctx, m)
		m.mu.Lock()
		m.passes, m.passed = f.passAfter, true
		m.b.SetHealthy(true)
		m.mu.Unlock()
		f.log.Info("backend added", "backend", m.b.Name, "url", m.base, "index", m.b.Index,
			"ready_in", f.now().Sub(started).Round(time.Millisecond))
	})
}
