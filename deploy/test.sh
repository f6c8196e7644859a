#!/usr/bin/env bash
# README's test command: install dependencies, build with warnings as errors, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
bash deploy/check-format.sh
npm ci --prefix deploy/validate --no-audit --no-fund --silent  # offline manifest validation
# ONNX Runtime for the export test; --ignore-scripts: its CPU library ships in the package
# (the install script would only fetch optional GPU parts).
npm ci --prefix tests/onnx --ignore-scripts --no-audit --no-fund --silent
build_dir="${BUILD_DIR:-build/ci}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOCALPAR_WERROR=ON
cmake --build "$build_dir" -j "$(nproc)"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@"
# The shipped Compose cluster as separate containers: images built (and cached by a hash of
# their inputs), a worker and then the coordinator container killed mid-run, the weights
# compared bitwise, Prometheus and the dashboard's queries checked (LOCALPAR_SKIP_CONTAINERS=1
# skips it for a quick local run; CI never sets it).
python3 tests/containers/compose_test.py
# Then the same tests under AddressSanitizer/UndefinedBehaviorSanitizer, and the fuzzers
# (a second build; LOCALPAR_SKIP_SANITIZE=1 skips it for a quick local run).
# Each fuzzer runs 15 s here (30 s by default when run by hand) to keep CI near 40 minutes.
if [ "${LOCALPAR_SKIP_SANITIZE:-0}" != 1 ]; then
  FUZZ_SECONDS="${FUZZ_SECONDS:-15}" bash deploy/sanitize.sh
fi
