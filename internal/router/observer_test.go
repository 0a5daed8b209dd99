package router

import (
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
)

// firstPolicy picks the first candidate, for the router's own tests.
type firstPolicy struct{}

func (firstPolicy) Name() string { return "first" }
func (firstPolicy) Pick(_ *Request, cands []*fleet.Backend) (Decision, error) {
	return Decision{Backend: cands[0], Reason: "first"}, nil
}

// tickets is an Observer that keeps what it is told.
type tickets []*Ticket

func (ts *tickets) Routed(t *Ticket) { *ts = append(*ts, t) }

func TestObserverToldOfEveryTicket(t *testing.T) {
	bs := backends(2)
	r := NewRouter(firstPolicy{}, nil)
	var seen tickets
	r.SetObserver(&seen)
	for _, cands := range [][]*fleet.Backend{bs, bs[1:]} {
		tk, err := r.Route(&Request{Prompt: "hello"}, cands)
		if err != nil {
			t.Fatal(err)
		}
		tk.Finish(Failed(0))
	}
	if len(seen) != 2 || seen[0].Backend != bs[0] || seen[1].Backend != bs[1] || seen[1].Reason != "first" {
		t.Fatalf("observer saw %d tickets: %+v", len(seen), seen)
	}
	if seen[0].Request().PromptTokens <= 0 {
		t.Errorf("the observer's ticket has no token estimate: %d", seen[0].Request().PromptTokens)
	}
}
