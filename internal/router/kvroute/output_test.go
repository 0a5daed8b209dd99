package kvroute

import (
	"math"
	"testing"

	"github.com/kvroute/kvroute/internal/router"
)

func TestOutputsExpect(t *testing.T) {
	o := newOutputs()
	asked := &router.Request{Model: "m", MaxTokens: 1000, PromptTokens: 500}
	if e := o.expect(asked); e.mean != 1000 || e.high != 1000 {
		t.Errorf("nothing learned: %+v, want max_tokens", e)
	}
	// Clients ask for four times what they get.
	for range 200 {
		o.observe(asked, 250)
	}
	if e := o.expect(asked); math.Abs(e.mean-250) > 1 || e.high < 250 {
		t.Errorf("after 1/4 of max_tokens each time: %+v, want a mean of 250", e)
	}

	// Without max_tokens: the prompt size's distribution, then the session's.
	free := &router.Request{Model: "m", PromptTokens: 5000} // another size than asked
	for i := range 400 {
		o.observe(free, 100+200*(i%2)) // half 100, half 300
	}
	e := o.expect(free)
	if math.Abs(e.mean-200) > 5 {
		t.Errorf("mean %v, want 200", e.mean)
	}
	if e.high < 300 || e.high > 400 {
		t.Errorf("high quantile %v, want the bucket of 300", e.high)
	}
	s := &router.Request{Model: "m", PromptTokens: 500, SessionKey: "s"}
	o.observe(s, 2000)
	if e := o.expect(s); e.mean != 2000 || e.high < 2000 {
		t.Errorf("a session that got 2000: %+v", e)
	}
	if e := o.expect(&router.Request{Model: "other"}); e.mean != defaultOutput {
		t.Errorf("unknown model: %+v, want the default", e)
	}
}

func TestOutputsFutureTurns(t *testing.T) {
	o := newOutputs()
	turn := func(session string) *router.Request {
		return &router.Request{Model: "m", PromptTokens: 100, SessionKey: session}
	}
	if e := o.expect(turn("new")); e.future != 0 {
		t.Errorf("nothing learned: future %v, want 0", e.future)
	}
	// Half the sessions have 2 turns, half 4.
	for i := range 40 {
		key := string(rune('a'+i%26)) + string(rune('0'+i/26))
		n := 2 + 2*(i%2)
		for range n {
			o.observe(turn(key), 100)
		}
	}
	// A session that has had one turn is priced on its second: after it,
	// half the sessions have two more, half none.
	o.observe(turn("s"), 100)
	if e := o.expect(turn("s")); math.Abs(e.future-1) > 0.05 {
		t.Errorf("after one turn: future %v, want 1", e.future)
	}
	o.observe(turn("s"), 100)
	o.observe(turn("s"), 100)
	if e := o.expect(turn("s")); e.future != 0 {
		t.Errorf("on the fourth turn: future %v, want 0", e.future)
	}
	if e := o.expect(turn("unknown")); e.future != 0 {
		t.Errorf("a session not seen: future %v, want 0", e.future)
	}
}
