package main

import (
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/shareddata"
	"github.com/kvroute/kvroute/internal/workload"
)

// The flags that bench and sim share: which engine, which policies, which
// workload, and where the results go.

// lookupProfile returns the engine profile called name, with kvBlocks KV
// blocks when positive.
func lookupProfile(name string, kvBlocks int) (engine.Profile, error) {
	p, err := engine.LookupProfile(name)
	if err != nil {
		return p, err
	}
	if kvBlocks > 0 {
		p.NumGPUBlocks = kvBlocks
	}
	return p, nil
}

// parsePolicies splits a --policies list ("all" is every name of all) and
// checks each name: a router policy, or one that external accepts (nil: none).
func parsePolicies(list string, all []string, external func(string) bool) ([]string, error) {
	if list == "all" {
		list = strings.Join(all, ",")
	}
	var names []string
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if external == nil || !external(name) {
			if _, err := router.New(name, nil, router.Options{}); err != nil {
				return nil, err
			}
		}
		names = append(names, name)
	}
	return names, nil
}

// loadWorkload loads the workload spec names (multiturn without a path reads
// the MT-Bench prompts beside the checkout) and returns it with the default
// output directory out/PREFIX-NAME.
func loadWorkload(spec string, opts workload.Options, prefix string) (workload.Workload, string, error) {
	if spec == "multiturn" {
		path, err := shareddata.Path(workload.DefaultMTBench)
		if err != nil {
			return workload.Workload{}, "", fmt.Errorf("multiturn: %w (or give multiturn:PATH)", err)
		}
		spec += ":" + path
	}
	w, err := workload.Load(spec, opts)
	name, _, _ := strings.Cut(spec, ":")
	return w, filepath.Join("out", prefix+"-"+name), err
}

// objectiveFlag defines --objective, kvroute's objective.
func objectiveFlag(fs *flag.FlagSet, dst *router.Objective) {
	names := make([]string, 0, 3)
	for _, o := range router.Objectives() {
		names = append(names, string(o))
	}
	*dst = router.Objectives()[0]
	fs.Func("objective", "kvroute: what it minimises: "+strings.Join(names, ", ")+" (default "+names[0]+"; goodput serves --goodput's joint objective)", func(v string) error {
		if !slices.Contains(router.Objectives(), router.Objective(v)) {
			return fmt.Errorf("unknown objective %q (have %s)", v, strings.Join(names, ", "))
		}
		*dst = router.Objective(v)
		return nil
	})
}
