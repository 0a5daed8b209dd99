package router

// Observer is told of every attempt a Router routes, with its ticket: an
// operator's view (the fleet page's recent decisions) keeps what it shows
// from there, so that explaining decisions needs no debug log. Routed is
// called on the request's path, from Route, for every attempt (retries
// too): it must not block, allocate if it can help it, or keep t or
// t.Decision.Scores past its return (the policy may reuse them); it may
// copy what it needs.
type Observer interface {
	Routed(t *Ticket)
}

// SetObserver makes o the router's observer (nil: none). Call it before the
// first Route: the field is read without a lock, as the policy is.
func (r *Router) SetObserver(o Observer) { r.observer = o }
