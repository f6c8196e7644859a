#!/usr/bin/env bash
# README's main command: install dependencies, build, and train fashion_mlp on a local cluster
# (one worker process per stage plus the coordinator, over gRPC on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
build_dir="${BUILD_DIR:-build/release}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
job="${1:-deploy/jobs/fashion_mlp.textproto}"
shift || true
exec "$build_dir/localpar" run "$job" "$@"
