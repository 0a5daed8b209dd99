#!/usr/bin/env bash
# llama-fleet.sh: a fleet of real llama.cpp servers on loopback, for the
# end-to-end test and `kvroute bench --backend-url`.
#
#   scripts/llama-fleet.sh build              build llama-server once per machine
#   scripts/llama-fleet.sh model              write the random-weight model
#   scripts/llama-fleet.sh start [N]          start N servers (default 3)
#   scripts/llama-fleet.sh stop               stop the servers this script started
#   scripts/llama-fleet.sh urls               print the running servers' URLs, comma-separated
#
# Everything built or written lives under the cache directory, never in the
# repo: llama.cpp is not our code and is not committed, only this recipe.
# Settings (environment): LLAMA_PORT (first port, 18080), LLAMA_THREADS (1),
# LLAMA_SLOTS (4), LLAMA_CTX (context per server, 16384), LLAMA_DIM (512),
# LLAMA_LAYERS (8).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${KVROUTE_LLAMA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvroute/llama.cpp}
# The npm package is only a carrier for llama.cpp's source; pinning it pins
# the engine version every measurement was taken with.
npm_version=3.21.1
server=$cache/bin/llama-server
vocab=$cache/models/ggml-vocab-llama-spm.gguf
run=$cache/run

die() { echo "llama-fleet: $*" >&2; exit 1; }

build() {
  if [ -x "$server" ] && [ -f "$vocab" ]; then
    echo "$server"
    return
  fi
  command -v cmake >/dev/null || die "cmake is missing (apt-get install -y cmake)"
  command -v npm >/dev/null || die "npm is missing"
  command -v c++ >/dev/null || die "a C++ compiler is missing (apt-get install -y g++)"
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/llama-build.XXXXXX")
  trap 'rm -rf "$work"' RETURN
  echo "llama-fleet: fetching node-llama-cpp@$npm_version (for its llama.cpp source bundle)" >&2
  (cd "$work" && npm pack --silent "node-llama-cpp@$npm_version" >/dev/null)
  tar -xzf "$work"/node-llama-cpp-*.tgz -C "$work" package/llama/gitRelease.bundle
  git -c advice.detachedHead=false clone -q "$work/package/llama/gitRelease.bundle" "$work/src"
  echo "llama-fleet: building llama-server (several minutes on 2 cores)" >&2
  # Static libraries so the one binary can be copied out of the build tree;
  # the prebuilt web UI and OpenSSL would need downloads this machine cannot make.
  cmake -S "$work/src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >"$work/configure.log" 2>&1 ||
    { tail -30 "$work/configure.log" >&2; die "cmake configure failed"; }
  cmake --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 ||
    { tail -30 "$work/build.log" >&2; die "build failed"; }
  mkdir -p "$cache/bin" "$cache/models"
  cp "$work/src/models/ggml-vocab-llama-spm.gguf" "$vocab"
  install -m 0755 "$work/build/bin/llama-server" "$server.tmp"
  mv "$server.tmp" "$server"
  git -C "$work/src" describe --tags --always >"$cache/VERSION" 2>/dev/null || true
  echo "$server"
}

# model prints the path of the random-weight model, writing it first if
# needed (cmd/llama-model knows the GGUF format; bash does not).
model() {
  [ -f "$vocab" ] || die "no vocabulary at $vocab: run '$0 build' first"
  (cd "$repo" && KVROUTE_LLAMA_DIR=$cache go run ./cmd/llama-model \
    -dim "${LLAMA_DIM:-512}" -layers "${LLAMA_LAYERS:-8}")
}

start() {
  local n=${1:-3} port=${LLAMA_PORT:-18080} i pidfile
  [[ $n =~ ^[1-9][0-9]*$ ]] || die "server count must be a positive integer, got '$n'"
  [ -x "$server" ] || die "no llama-server at $server: run '$0 build' first"
  local model
  model=$(model)
  mkdir -p "$run"
  for ((i = 0; i < n; i++)); do
    pidfile=$run/$((port + i)).pid
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      die "a server already runs on port $((port + i)); '$0 stop' first"
    fi
    "$server" -m "$model" -a random-llama --host 127.0.0.1 --port $((port + i)) \
      -c "${LLAMA_CTX:-16384}" -np "${LLAMA_SLOTS:-4}" -t "${LLAMA_THREADS:-1}" \
      --metrics --slots --no-webui --chat-template chatml --no-jinja >"$run/$((port + i)).log" 2>&1 &
    echo $! >"$pidfile"
  done
  for ((i = 0; i < n; i++)); do
    wait_healthy "http://127.0.0.1:$((port + i))" || die "server on port $((port + i)) did not become healthy; see $run/$((port + i)).log"
  done
  urls
}

wait_healthy() {
  local t
  for ((t = 0; t < 600; t++)); do
    curl -fsS "$1/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

stop() {
  local f pid t pids=()
  shopt -s nullglob
  for f in "$run"/*.pid; do
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null && pids+=("$pid")
    rm -f "$f"
  done
  # Wait for the ports to be free, so that a start right after works.
  for pid in "${pids[@]}"; do
    for ((t = 0; t < 100; t++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  done
}

urls() {
  local f out=() port
  shopt -s nullglob
  for f in "$run"/*.pid; do
    kill -0 "$(cat "$f")" 2>/dev/null || continue
    port=$(basename "$f" .pid)
    out+=("http://127.0.0.1:$port")
  done
  (IFS=,; echo "${out[*]}")
}

case "${1:-}" in
  build) build ;;
  model) model ;;
  start) shift; start "$@" ;;
  stop) stop ;;
  urls) urls ;;
  *) die "usage: $0 build|model|start [N]|stop|urls" ;;
esac
