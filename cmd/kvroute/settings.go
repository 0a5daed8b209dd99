package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	yaml "go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/internal/fleet"
)

// envPrefix starts the environment variable of every flag: --first-token-floor
// is KVROUTE_FIRST_TOKEN_FLOOR.
const envPrefix = "KVROUTE_"

// envName is flag name's environment variable.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// applySettings gives every flag of fs that the command line did not set
// its value from the environment (KVROUTE_*) or, failing that, from the
// YAML file at path (when not empty), where every flag is a key with
// underscores (first_token_floor: 15s) beside the backends list. It returns
// the file's backends, if it has any. An unknown key, or a value the flag
// refuses, is an error naming it.
func applySettings(fs *flag.FlagSet, path string, lookupEnv func(string) (string, bool)) ([]*fleet.Backend, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		v, ok := lookupEnv(envName(f.Name))
		if err != nil || set[f.Name] || !ok || f.Name == "config" {
			return
		}
		if e := setFlag(fs, f.Name, []string{v}); e != nil {
			err = fmt.Errorf("%s: %w", envName(f.Name), e)
		}
		set[f.Name] = true
	})
	if err != nil || path == "" {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var file map[string]any
	if err := dec.Decode(&file); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	keys := make([]string, 0, len(file))
	for k := range file {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var backends []*fleet.Backend
	for _, k := range keys {
		v := file[k]
		if k == "backends" {
			part, _ := yaml.Marshal(map[string]any{"backends": v}) // just decoded: cannot fail
			fc, err := fleet.ParseConfig(part)
			if err != nil {
				return nil, backendError(fmt.Errorf("%s: %w", path, err)) // startuperrors.go
			}
			backends = fc.Backends
			continue
		}
		name := strings.ReplaceAll(k, "_", "-")
		if fs.Lookup(name) == nil || name == "config" || name == "backend" {
			return nil, unknownKey(fs, path, k)
		}
		if set[name] {
			continue
		}
		var vals []string
		switch v := v.(type) {
		case []any:
			for _, x := range v {
				vals = append(vals, fmt.Sprint(x))
			}
		case nil:
			return nil, fmt.Errorf("%s: %s has no value", path, k)
		default:
			vals = []string{fmt.Sprint(v)}
		}
		if err := setFlag(fs, name, vals); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", path, k, err)
		}
	}
	return backends, nil
}

// unknownKey is the error of key k of the file at path, which names no
// flag: it offers the nearest key when k looks like a typo of one.
func unknownKey(fs *flag.FlagSet, path, k string) error {
	keys := []string{"backends"}
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "config" && f.Name != "backend" {
			keys = append(keys, configKey(f.Name))
		}
	})
	hint := "the keys are the flags of --help, with underscores, and backends"
	if near := closestKey(k, keys); near != "" {
		hint = fmt.Sprintf("did you mean %s? %s", near, hint)
	}
	return fmt.Errorf("%s: unknown key %q (%s)", path, k, hint)
}

// setFlag sets flag name to each of vals in turn (a repeatable flag takes
// them all; from the environment, a repeatable flag's value is split at
// commas).
func setFlag(fs *flag.FlagSet, name string, vals []string) error {
	f := fs.Lookup(name)
	if _, repeatable := f.Value.(*stringList); repeatable && len(vals) == 1 {
		vals = strings.Split(vals[0], ",")
	}
	for _, v := range vals {
		if err := f.Value.Set(strings.TrimSpace(v)); err != nil {
			return err
		}
	}
	return nil
}
