package server

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"github.com/kvroute/kvroute/internal/fleet"
)

// Group runs a server's goroutines (listeners, the fleet's loops) and keeps
// the first error one of them ended with that is not the way it is told to
// stop. `kvroute serve` and the endpoint picker both run theirs in one.
type Group struct {
	wg     sync.WaitGroup
	errc   chan error
	benign []error // ends that are not failures, beside the common ones
}

// NewGroup returns a group; benign are errors that, besides
// http.ErrServerClosed, context.Canceled and fleet.ErrRunning, mean an
// orderly stop.
func NewGroup(benign ...error) *Group {
	return &Group{errc: make(chan error, 3), benign: benign}
}

// Go runs fn in a goroutine Wait waits for.
func (g *Group) Go(fn func() error) {
	g.wg.Go(func() {
		if err := fn(); err != nil && !g.orderly(err) {
			select {
			case g.errc <- err:
			default:
			}
		}
	})
}

func (g *Group) orderly(err error) bool {
	for _, b := range append([]error{http.ErrServerClosed, context.Canceled, fleet.ErrRunning}, g.benign...) {
		if errors.Is(err, b) {
			return true
		}
	}
	return false
}

// Err receives the first error a goroutine failed with.
func (g *Group) Err() <-chan error { return g.errc }

// Wait waits for every goroutine Go started.
func (g *Group) Wait() { g.wg.Wait() }
