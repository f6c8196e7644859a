#!/usr/bin/env bash
# README's test command: install dependencies, build with warnings as errors, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
bash deploy/check-format.sh
npm ci --prefix deploy/validate --no-audit --no-fund --silent  # offline manifest validation
build_dir="${BUILD_DIR:-build/ci}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOCALPAR_WERROR=ON
cmake --build "$build_dir" -j "$(nproc)"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@"
# Then the same tests under AddressSanitizer/UndefinedBehaviorSanitizer, and the fuzzers
# (a second build; LOCALPAR_SKIP_SANITIZE=1 skips it for a quick local run).
if [ "${LOCALPAR_SKIP_SANITIZE:-0}" != 1 ]; then
  bash deploy/sanitize.sh
fi
