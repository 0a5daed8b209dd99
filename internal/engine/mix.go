package engine

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// A FleetPart is Count servers of one profile in a mixed fleet; Profile.Model
// is the model they serve (the profile's own unless the spec renamed it).
type FleetPart struct {
	Profile Profile
	Count   int
}

// ParseFleet reads a fleet spec: one profile name, or a comma-separated list
// of NAME[=MODEL]:COUNT, COUNT servers of profile NAME serving MODEL (default
// the profile's model), e.g. "h100-llama3-8b:4,a100-llama3-8b:4". A lone name
// without a count returns one part of Count 0: every server, however many.
// Every part of a list must give its count, and all must share a block size
// (one prefix index spans the fleet).
func ParseFleet(spec string) ([]FleetPart, error) {
	items := strings.Split(spec, ",")
	var parts []FleetPart
	for _, item := range items {
		item = strings.TrimSpace(item)
		name, count := item, 0
		if n, c, ok := strings.Cut(item, ":"); ok {
			v, err := strconv.Atoi(c)
			if err != nil || v < 1 {
				return nil, fmt.Errorf("fleet %q: %q: the count after %q must be a whole number of servers, at least 1", spec, item, ":")
			}
			name, count = n, v
		} else if len(items) > 1 {
			return nil, fmt.Errorf("fleet %q: %q has no count: a mixed fleet gives every profile as NAME:COUNT", spec, item)
		}
		name, model, renamed := strings.Cut(name, "=")
		if renamed && model == "" {
			return nil, fmt.Errorf("fleet %q: %q: empty model name after =", spec, item)
		}
		p, err := LookupProfile(name)
		if err != nil {
			return nil, fmt.Errorf("fleet %q: %w", spec, err)
		}
		if renamed {
			p.Model = model
		}
		if len(parts) > 0 && p.BlockSize != parts[0].Profile.BlockSize {
			return nil, fmt.Errorf("fleet %q: %s has blocks of %d tokens, %s of %d: a fleet's servers must share one block size",
				spec, p.Name, p.BlockSize, parts[0].Profile.Name, parts[0].Profile.BlockSize)
		}
		parts = append(parts, FleetPart{Profile: p, Count: count})
	}
	if len(parts) == 0 {
		return nil, errors.New("empty fleet spec")
	}
	return parts, nil
}

// FleetServers returns one profile per server, the parts' servers in order;
// a single part of Count 0 gives backends servers of its profile.
func FleetServers(parts []FleetPart, backends int) []Profile {
	var out []Profile
	for _, p := range parts {
		n := p.Count
		if n == 0 {
			n = backends
		}
		for range n {
			out = append(out, p.Profile)
		}
	}
	return out
}

// FleetSize is the number of servers the parts name, 0 when a lone part
// leaves it to the caller.
func FleetSize(parts []FleetPart) int {
	n := 0
	for _, p := range parts {
		n += p.Count
	}
	return n
}
