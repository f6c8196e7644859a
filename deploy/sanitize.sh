#!/usr/bin/env bash
# A second build with clang, AddressSanitizer and UndefinedBehaviorSanitizer (and libFuzzer
# coverage): runs the unit and integration tests once under the sanitizers, then every
# fuzz target for FUZZ_SECONDS each (default 30) from the seed corpus in tests/fuzz/corpus.
# CUDA is left out of this build (no GPU on CI machines; nvcc does not take these flags).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${SANITIZE_BUILD_DIR:-build/asan}"
CC=clang-14 CXX=clang++-14 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLOCALPAR_SANITIZE=ON -DLOCALPAR_FUZZ=ON -DLOCALPAR_WITH_CUDA=OFF -DLOCALPAR_WERROR=ON >/dev/null
t0=$SECONDS
cmake --build "$build" -j "$(nproc)"
echo "ci: sanitize build took $((SECONDS - t0)) s"
t0=$SECONDS
export ASAN_OPTIONS="detect_leaks=0:strict_string_checks=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LOCALPAR_HOSTILE_RSS_MIB=2000  # ASan's shadow memory and quarantine
export LOCALPAR_SANITIZED=1  # memory figures that are ASan's are not checked
# The long accuracy runs, the memory-growth test (ASan's quarantine grows memory by design)
# and the benchmarks run in the normal build only.
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" -L "core|data|services|cluster" \
  -E "FashionMlp|QueuesStayBounded|bench"
echo "ci: sanitize ctest took $((SECONDS - t0)) s"
t0=$SECONDS
for target in tensor job idx checkpoint item npy; do
  work=$(mktemp -d)
  extra=()
  [ "$target" = job ] && extra=(deploy/jobs)
  echo "fuzz: $target for ${FUZZ_SECONDS:-30} s"
  # libFuzzer exits non-zero on a crash, a leak, a timeout or running out of memory; crash
  # inputs land in $work, not in the tree.
  if ! "$build/fuzz/${target}_fuzz" -max_total_time="${FUZZ_SECONDS:-30}" -rss_limit_mb=2048 \
      -malloc_limit_mb=512 -timeout=10 -print_final_stats=1 -artifact_prefix="$work/" \
      "$work" "tests/fuzz/corpus/$target" "${extra[@]}" > "$work/log" 2>&1; then
    tail -n 40 "$work/log"
    echo "fuzz: $target FAILED (inputs in $work)"
    exit 1
  fi
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|Done)" "$work/log" || true
  rm -rf "$work"
done
echo "ci: fuzzers took $((SECONDS - t0)) s"
echo "sanitize: ok"
