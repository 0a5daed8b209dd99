package router

import "testing"

func TestKVRouteTiesGoToTheCache(t *testing.T) {
	bs := backends(4)
	p := NewKVRoute(bs, KVRouteConfig{Seed: 1})
	// A 64-token shared head saves a few milliseconds of prefill: within
	// the tie tolerance, yet the backend holding it must win the tie.
	head := words(0, 256)
	holder := pick(t, p, &Request{Prompt: head + words(1, 100)}, bs).Backend
	for i := range 50 {
		d := pick(t, p, &Request{Prompt: head + words(i+2, 100)}, bs)
		if d.Backend != holder {
			t.Fatalf("request %d went to %s, away from %s that holds its head", i, d.Backend.Name, holder.Name)
		}
	}
}
