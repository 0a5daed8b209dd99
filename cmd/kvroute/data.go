package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/internal/shareddata"
)

// fetchTimeout bounds the whole download (about 4 MB).
const fetchTimeout = 5 * time.Minute

// runData runs `kvroute data fetch` and `kvroute data list`: the public
// traces and prompts the workloads read, which are not in the repository.
func runData(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvroute data", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "data directory fetch writes to (default $"+shareddata.EnvDir+", else kvroute/data in the user's cache directory, ~/.cache on Linux); the workloads look in ../shared/data beside the checkout first, then there")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: kvroute data fetch|list [flags]\n\n"+
			"fetch downloads the public data sets the trace workloads read (the Mooncake and Azure\n"+
			"traces, the MT-Bench prompts, and their licenses) from their upstream repositories at\n"+
			"pinned commits, checks each file's SHA-256, and writes them to --dir. list shows where\n"+
			"each file is found. Sources and licenses: docs/data.md.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	var verb string
	if len(args) > 0 && (args[0] == "fetch" || args[0] == "list") {
		verb, args = args[0], args[1:]
	}
	if code, ok := flagsDone("data", fs.Parse(args), stderr); !ok {
		return code
	}
	switch {
	case verb == "" || fs.NArg() > 0:
		fs.Usage()
		return 2
	case verb == "list":
		for _, st := range shareddata.Check() {
			state := "missing: run `" + shareddata.FetchStep + "`"
			switch {
			case st.Path != "" && st.OK:
				state = st.Path
			case st.Path != "":
				state = st.Path + " (checksum differs from the pinned one)"
			}
			fmt.Fprintf(stdout, "%-40s %s\n", st.Name, state)
		}
		return 0
	}
	if *dir == "" {
		d, err := shareddata.DefaultDir()
		if err != nil {
			fmt.Fprintf(stderr, "kvroute data: %v\n", err)
			return 1
		}
		*dir = d
	}
	ctx, stop := signalContext()
	defer stop()
	client := &http.Client{Timeout: fetchTimeout}
	if err := shareddata.Fetch(ctx, client, *dir, shareddata.Files, stdout); err != nil {
		fmt.Fprintf(stderr, "kvroute data fetch: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "the data sets are in %s (sources and licenses: docs/data.md)\n", *dir)
	if def, _ := shareddata.DefaultDir(); def != *dir {
		fmt.Fprintf(stdout, "the workloads look there with %s=%s\n", shareddata.EnvDir, *dir)
	}
	return 0
}
