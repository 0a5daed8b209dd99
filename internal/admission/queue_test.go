package admission

import (
	"fmt"
	"testing"
)

func newWaiter(seq uint64, tenant string, cost int64) *waiter {
	return &waiter{tenant: tenant, cost: cost, seq: seq}
}

func TestClassQueueOrder(t *testing.T) {
	tests := []struct {
		name   string
		arrive []struct {
			tenant string
			cost   int64
		}
		want []int // arrival indexes in admission order
	}{
		{
			name: "one tenant is FCFS",
			arrive: []struct {
				tenant string
				cost   int64
			}{{"a", 500}, {"a", 1}, {"a", 100}},
			want: []int{0, 1, 2},
		},
		{
			name: "equal costs alternate",
			arrive: []struct {
				tenant string
				cost   int64
			}{{"a", 10}, {"a", 10}, {"a", 10}, {"b", 10}, {"b", 10}, {"b", 10}},
			want: []int{0, 3, 1, 4, 2, 5},
		},
		{
			name: "tokens, not requests, are shared",
			arrive: []struct {
				tenant string
				cost   int64
			}{{"big", 300}, {"big", 300}, {"small", 100}, {"small", 100}, {"small", 100}, {"small", 100}},
			want: []int{0, 2, 3, 4, 1, 5},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var q classQueue
			byPtr := map[*waiter]int{}
			for i, a := range tt.arrive {
				w := newWaiter(uint64(i), a.tenant, a.cost)
				byPtr[w] = i
				q.push(w)
			}
			var got []int
			for q.len() > 0 {
				got = append(got, byPtr[q.pop()])
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("order %v, want %v", got, tt.want)
			}
			if len(q.tenants) != 0 || q.vtime != 0 {
				t.Errorf("left %d tenants, vtime %d", len(q.tenants), q.vtime)
			}
		})
	}
}

func TestClassQueueRemoveGivesBackTime(t *testing.T) {
	var q classQueue
	a1, a2 := newWaiter(1, "a", 1000), newWaiter(2, "a", 1000)
	q.push(a1)
	q.push(a2)
	q.remove(a2) // the tenant's latest: its reservation is returned
	if got := q.startFor("a"); got != 1000 {
		t.Errorf("next start %d after removing the latest, want 1000", got)
	}
	a3 := newWaiter(3, "a", 1000)
	q.push(a3)
	q.remove(a1) // not the latest: a3 keeps its tag
	if a3.start != 1000 {
		t.Errorf("a3 start %d, want 1000", a3.start)
	}
	if q.last() != a3 || q.head() != a3 {
		t.Errorf("a3 should be head and last")
	}
}

func TestClassQueueLast(t *testing.T) {
	var q classQueue
	var ws []*waiter
	for i := range 50 {
		w := newWaiter(uint64(i), fmt.Sprint(i%7), int64(1+i%13))
		ws = append(ws, w)
		q.push(w)
	}
	want := ws[0]
	for _, w := range ws {
		if less(want, w) {
			want = w
		}
	}
	if got := q.last(); got != want {
		t.Errorf("last = seq %d, want seq %d", got.seq, want.seq)
	}
}

// TestClassQueueForgetsIdleTenants: while the queue never empties, one-off
// tenants that were served are forgotten, so memory follows the waiters.
func TestClassQueueForgetsIdleTenants(t *testing.T) {
	var q classQueue
	var seq uint64
	push := func(tenant string, cost int64) {
		seq++
		q.push(newWaiter(seq, tenant, cost))
	}
	for range 8 {
		push("steady", 1)
	}
	for i := range 100_000 {
		push(fmt.Sprint("one-off", i), 1_000_000) // owed long after it is served
		q.pop()
		if q.len() < 8 {
			push("steady", 1)
		}
		if n := len(q.tenants); n > 2*q.len()+idleSlack+1 {
			t.Fatalf("after %d one-off tenants: %d known for %d waiters", i+1, n, q.len())
		}
	}
}
