package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/internal/fleet"
)

// dpRankFlag is --dp-ranks NAME=N, repeatable: the --backend called NAME is
// a server of N data-parallel ranks, routed to as N backends.
type dpRankFlag map[string]int

func (d dpRankFlag) String() string {
	var parts []string
	for name, n := range d {
		parts = append(parts, name+"="+strconv.Itoa(n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

func (d dpRankFlag) Set(v string) error {
	name, n, ok := strings.Cut(v, "=")
	ranks, err := strconv.Atoi(n)
	if !ok || name == "" || err != nil || ranks < 1 {
		return fmt.Errorf("%q: want NAME=RANKS, the name of a --backend and its data-parallel ranks (at least 1)", v)
	}
	d[name] = ranks
	return nil
}

// unused fails when a name of the flag is no backend's: a typo would
// otherwise leave a DP server routed to as one cache domain.
func (d dpRankFlag) unused(bs []*fleet.Backend) error {
	for name := range d {
		if !slices.ContainsFunc(bs, func(b *fleet.Backend) bool {
			return b.Name == name || b.Ranks > 1 && strings.HasPrefix(b.Name, name+"/dp")
		}) {
			return fmt.Errorf("--dp-ranks names %q, which is no --backend", name)
		}
	}
	return nil
}
