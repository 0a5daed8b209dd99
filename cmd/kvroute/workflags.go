package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/router/kvroute"
	"github.com/kvroute/kvroute/internal/router/policies"
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
			if _, err := policies.New(name, nil, policies.Options{}); err != nil {
				return nil, err
			}
		}
		names = append(names, name)
	}
	return names, nil
}

// defaultData is the data file each trace workload reads when its spec
// names no path.
var defaultData = map[string]string{
	"multiturn": workload.DefaultMTBench,
	"mooncake":  "mooncake/conversation_trace.jsonl",
	"azure":     "azure/AzureLLMInferenceTrace_conv.csv",
}

// loadWorkload loads the workload spec names (a trace workload without a
// path reads its data set from ../shared/data or the data directory) and
// returns it with the default output directory out/PREFIX-NAME. Its name
// (the reports' title and results.json's workload) is the data set's file
// name, never its path. A data file
// that is missing is an error naming `kvroute data fetch`.
func loadWorkload(spec string, opts workload.Options, prefix string) (workload.Workload, string, error) {
	name, path, hasPath := strings.Cut(spec, ":")
	if file, ok := defaultData[name]; ok {
		var err error
		if hasPath {
			path, err = dataFile(path)
		} else if path, err = shareddata.Path(file); err != nil {
			err = fmt.Errorf("%w (or give %s:PATH)", err, name)
		}
		if err != nil {
			return workload.Workload{}, "", fmt.Errorf("workload %s: %w", name, err)
		}
		spec = name + ":" + path
	}
	w, err := workload.Load(spec, opts)
	return w, filepath.Join("out", prefix+"-"+name), err
}

// dataFile returns path when it exists. A missing path into ../shared/data
// (as the docs' commands, written for CI, give it) is looked up where
// `kvroute data fetch` puts the same file; otherwise its absence is an error
// naming that step.
func dataFile(path string) (string, error) {
	_, err := os.Stat(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return path, nil // there, or an error the workload reports
	}
	if _, name, ok := strings.Cut(filepath.ToSlash(path), "shared/data/"); ok {
		return shareddata.Path(name)
	}
	return "", fmt.Errorf("%s does not exist; `%s` downloads the public data sets (docs/data.md)", path, shareddata.FetchStep)
}

// objectiveFlag defines --objective, kvroute's objective.
func objectiveFlag(fs *flag.FlagSet, dst *kvroute.Objective) {
	names := make([]string, 0, 3)
	for _, o := range kvroute.Objectives() {
		names = append(names, string(o))
	}
	*dst = kvroute.Objectives()[0]
	fs.Func("objective", "kvroute: what it minimises: "+strings.Join(names, ", ")+"; goodput serves --goodput's joint objective (default "+names[0]+")", func(v string) error {
		if !slices.Contains(kvroute.Objectives(), kvroute.Objective(v)) {
			return fmt.Errorf("unknown objective %q (have %s)", v, strings.Join(names, ", "))
		}
		*dst = kvroute.Objective(v)
		return nil
	})
}
