package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is kvroute's release, set when building one:
//
//	go build -ldflags "-X main.version=v0.4.0" ./cmd/kvroute
//
// Empty, versionString reads the module version from the build info (set
// by `go install module@version`).
var version string

// versionString describes the binary: its version, the commit it was built
// from (when the build recorded it: not with -buildvcs=false, nor with
// -trimpath outside a git checkout), and the Go toolchain.
func versionString() string {
	v, rev, dirty := version, "", false
	if info, ok := debug.ReadBuildInfo(); ok {
		if v == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "devel"
	}
	out := "kvroute " + v
	if rev != "" {
		out += " commit " + rev[:min(12, len(rev))]
		if dirty {
			out += "+modified"
		}
	}
	return fmt.Sprintf("%s %s %s/%s", out, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func runVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Fprintf(stderr, "Usage: kvroute version\n\nPrints the version, the commit when the build recorded it, and the Go toolchain. It has no flags.\n")
		return 0
	}
	if len(args) > 0 {
		fmt.Fprintf(stderr, "kvroute version: unexpected arguments: %q\n", args)
		return 2
	}
	fmt.Fprintln(stdout, versionString())
	return 0
}
