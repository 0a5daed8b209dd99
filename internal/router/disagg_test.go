package router

import (
	"net/url"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
)

func splitBackend(name string, queued, requests int) *fleet.Backend {
	b := fleet.NewBackend(0, name, &url.URL{Scheme: "http", Host: name})
	b.SetRole(fleet.RolePrefill)
	for i := range requests {
		tokens := 0
		if i == 0 {
			tokens = queued
		}
		b.Start(tokens, tokens)
	}
	return b
}

func TestSplitRules(t *testing.T) {
	idle, busy := splitBackend("idle", 0, 0), splitBackend("busy", 50_000, 3)
	dec := &Decision{Backend: fleet.NewBackend(1, "d", &url.URL{Scheme: "http", Host: "d"})}
	first := func(int) int { return 0 }
	tests := []struct {
		rule     string
		tokens   int
		cached   int
		prefills []*fleet.Backend
		want     *fleet.Backend
	}{
		{rule: "always", tokens: 10, prefills: []*fleet.Backend{busy, idle}, want: idle},
		{rule: "never", tokens: 100_000, prefills: []*fleet.Backend{idle}, want: nil},
		{rule: "length", tokens: 999, prefills: []*fleet.Backend{idle}, want: nil},
		{rule: "length", tokens: 1000, cached: 1000, prefills: []*fleet.Backend{idle}, want: idle},
		{rule: "cache", tokens: 5000, cached: 4900, prefills: []*fleet.Backend{idle}, want: nil},
		{rule: "cache", tokens: 5000, cached: 4872, prefills: []*fleet.Backend{idle}, want: idle},
		{rule: "load", tokens: 5000, cached: 4000, prefills: []*fleet.Backend{idle}, want: nil},
		{rule: "load", tokens: 5000, prefills: []*fleet.Backend{idle}, want: idle},
		{rule: "load", tokens: 5000, prefills: []*fleet.Backend{busy}, want: nil},
	}
	for _, tt := range tests {
		s, err := NewSplitRule(tt.rule, SplitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		d := *dec
		d.Cached = tt.cached
		if got := s.Split(&Request{PromptTokens: tt.tokens}, &d, tt.prefills, first); got != tt.want {
			t.Errorf("%s(%d tokens, %d cached) = %v, want %v", tt.rule, tt.tokens, tt.cached, got, tt.want)
		}
	}
	if _, err := NewSplitRule("sometimes", SplitOptions{}); err == nil {
		t.Error("an unknown rule was accepted")
	}
}
