#!/bin/sh
# bench-examples.sh regenerates the example reports in docs/bench/ with the
# simulator (kvroute sim: the engine model and the policies' own code in
# virtual time, deterministic for a seed), from the repository's root:
#
#   scripts/bench-examples.sh
#
# The trace workloads read the public data sets (`kvroute data fetch`,
# docs/data.md). Each report is a few seconds to a minute or two of CPU.
# Each page's title names its workload and data set, never a path.
set -eu

cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/kvroute" ./cmd/kvroute

# example NAME ARGS...: one `kvroute sim` run, its report.html kept as
# docs/bench/NAME.html.
example() {
	name=$1
	shift
	"$tmp/kvroute" sim --out "$tmp/$name" "$@"
	cp "$tmp/$name/report.html" "docs/bench/$name.html"
}

example mooncake --workload mooncake --duration 5m --compress 2 --backends 8 --policies all
example mixed --workload mixed --rate 30 --duration 60s --backends 8 --policies all
example multiturn --workload multiturn --rate 2 --duration 40s --backends 8 \
	--policies kvroute,round-robin,least-request,sglang-cache-aware,dynamo-kv,preble-e2
example small-chat --workload small-chat --backends 3 \
	--policies kvroute,round-robin,session-hash,sglang-cache-aware,preble-e2
