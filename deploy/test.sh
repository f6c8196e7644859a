#!/usr/bin/env bash
# README's test command: install dependencies, build with warnings as errors, run every test.
# Each step says how long it took ("ci: STEP took N s"), and the total at the end; the
# breakdown is in docs/development.md.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
step() {  # NAME COMMAND...: runs COMMAND, then says how long it took
  local name=$1 t0=$SECONDS
  shift
  "$@"
  echo "ci: $name took $((SECONDS - t0)) s"
}
npm_installs() {
  npm ci --prefix deploy/validate --no-audit --no-fund --silent  # offline manifest validation
  # ONNX Runtime for the export test; --ignore-scripts: its CPU library ships in the package
  # (the install script would only fetch optional GPU parts).
  npm ci --prefix tests/onnx --ignore-scripts --no-audit --no-fund --silent
}
build_dir="${BUILD_DIR:-build/ci}"
step install-deps bash deploy/install-deps.sh
step check-format bash deploy/check-format.sh
step npm npm_installs
step configure cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOCALPAR_WERROR=ON
step build cmake --build "$build_dir" -j "$(nproc)"
# The sanitizer build (deploy/sanitize.sh) starts now in the background, at the lowest CPU and
# I/O priority: it takes only the time the tests below leave idle (they wait on processes,
# sockets and clocks much of the time), so the tests run as fast as before.
asan_pid=""
if [ "${LOCALPAR_SKIP_SANITIZE:-0}" != 1 ]; then
  asan_log=$(mktemp)
  setsid nice -n 19 ionice -c 3 bash deploy/sanitize.sh --build-only > "$asan_log" 2>&1 &
  asan_pid=$!
  trap '[ -n "$asan_pid" ] && kill -- "-$asan_pid" 2>/dev/null; true' EXIT
fi
step ctest ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@"
# The shipped Compose cluster as separate containers: images built (and cached by a hash of
# their inputs), a worker and then the coordinator container killed mid-run, the weights
# compared bitwise, Prometheus and the dashboard's queries checked (LOCALPAR_SKIP_CONTAINERS=1
# skips it for a quick local run; CI never sets it).
step containers python3 tests/containers/compose_test.py
# Then the same tests under AddressSanitizer/UndefinedBehaviorSanitizer, and the fuzzers
# (a second build; LOCALPAR_SKIP_SANITIZE=1 skips it for a quick local run).
# Each fuzzer runs 15 s here (30 s by default when run by hand).
if [ -n "$asan_pid" ]; then
  t0=$SECONDS
  if ! wait "$asan_pid"; then
    asan_pid=""
    cat "$asan_log"
    echo "ci: the sanitizer build failed"
    exit 1
  fi
  asan_pid=""
  grep "^ci:" "$asan_log" || true
  echo "ci: waited $((SECONDS - t0)) s for the sanitizer build"
  FUZZ_SECONDS="${FUZZ_SECONDS:-15}" step sanitize bash deploy/sanitize.sh --test-only
fi
echo "ci: all steps took $((SECONDS - start)) s"
