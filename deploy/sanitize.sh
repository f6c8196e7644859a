#!/usr/bin/env bash
# A second build with clang, AddressSanitizer and UndefinedBehaviorSanitizer (and libFuzzer
# coverage): runs the unit and integration tests once under the sanitizers, then every
# fuzz target for FUZZ_SECONDS each (default 30) from the seed corpus in tests/fuzz/corpus.
# CUDA is left out of this build (no GPU on CI machines; nvcc does not take these flags).
#   deploy/sanitize.sh [--build-only | --test-only]
# (deploy/test.sh builds it in the background at the lowest CPU priority while the other
# tests run, then runs it with --test-only.)
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-all}"
case "$mode" in all|--build-only|--test-only) ;; *) echo "usage: $0 [--build-only|--test-only]"; exit 2 ;; esac
build="${SANITIZE_BUILD_DIR:-build/asan}"
if [ "$mode" != --test-only ]; then
CC=clang-14 CXX=clang++-14 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLOCALPAR_SANITIZE=ON -DLOCALPAR_FUZZ=ON -DLOCALPAR_WITH_CUDA=OFF -DLOCALPAR_WERROR=ON >/dev/null
t0=$SECONDS
# Only what the sanitizer run below uses: the programs, the test executables of its labels,
# allreduce_bench (the frontier test's replica check) and the fuzzers; the accuracy tests,
# the wire tests and the other benchmarks run in the normal build only.
cmake --build "$build" -j "$(nproc)" --target localpar localpar_worker localpar_coordinator \
  core_tests data_job_tests service_tests cluster_tests security_tests prometheus_tests \
  allreduce_bench tensor_fuzz job_fuzz idx_fuzz checkpoint_fuzz item_fuzz npy_fuzz
echo "ci: sanitize build took $((SECONDS - t0)) s"
fi
[ "$mode" = --build-only ] && exit 0
t0=$SECONDS
export ASAN_OPTIONS="detect_leaks=0:strict_string_checks=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LOCALPAR_HOSTILE_RSS_MIB=2000  # ASan's shadow memory and quarantine
export LOCALPAR_SANITIZED=1  # memory figures that are ASan's are not checked
# The long accuracy runs, the memory-growth test (ASan's quarantine grows memory by design)
# and the benchmarks run in the normal build only.
# The experiment runners' tests are Python over `localpar train` and `run`, whose C++ the
# cluster tests run here already: they run in the normal build only.
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" -L "core|data|services|cluster" \
  -E "FashionMlp|QueuesStayBounded|bench|experiments\\."
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
