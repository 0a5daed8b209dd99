#!/bin/sh
# engine-profiles.sh plays chat where users outnumber the batch slots
# (chat-long: one user in four asks for 1,000-token replies) on every
# engine profile, at two loads, through kvroute, kvroute with the engine
# model alone, and the other policies, in the simulator (deterministic for
# the seed), from the repository's root:
#
#   scripts/engine-profiles.sh [OUTDIR]
#
# Each run prints its table and writes OUTDIR/PROFILE-USERS/results.json
# (default OUTDIR: out/engine-profiles). About a minute of CPU in all.
set -eu

cd "$(dirname "$0")/.."
out=${1:-out/engine-profiles}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/kvroute" ./cmd/kvroute

policies=kvroute,kvroute:uncalibrated,least-request,session-hash,sglang-cache-aware,dynamo-kv,llmd-default,preble-e2
for profile in h100-llama3-8b h100-llama3-8b-batch-slowdown h100-llama3-8b-request-overhead \
	h100-llama3-8b-slow-prefill h100-llama3-8b-small-batch h100-llama3-8b-llamacpp-slots \
	h100-llama3-8b-no-prefix-caching; do
	for users in 32 64; do
		echo "== $profile, $users users"
		"$tmp/kvroute" sim --workload chat-long --users "$users" --backends 4 --duration 300s --seed 1 \
			--profile "$profile" --policies "$policies" --out "$out/$profile-$users"
	done
done
