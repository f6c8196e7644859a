#!/usr/bin/env bash
# Builds the compute core on a CUDA-only machine (no protobuf, gRPC, absl or OpenBLAS),
# then runs the CUDA-versus-CPU parity tests and the GPU step benchmark. One call, well
# under 6 minutes on an H200.
#
# GoogleTest is taken from the system if installed, else from GTEST_SRC (default
# .gpu-deps/googletest, filled on a machine that has it by: tests/gpu/run.sh --prepare).
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "${1:-}" = "--prepare" ]; then
  mkdir -p .gpu-deps
  rm -rf .gpu-deps/googletest
  cp -r /usr/src/googletest .gpu-deps/googletest
  echo "copied GoogleTest sources to .gpu-deps/googletest (carry this path to the GPU machine)"
  exit 0
fi

out="${OUT:-build/gpu-out}"
mkdir -p "$out"
build=build/gpu
gtest_src="${GTEST_SRC:-$PWD/.gpu-deps/googletest}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt" || true

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOCALPAR_CORE_ONLY=ON \
  -DLOCALPAR_WERROR=ON -DLOCALPAR_GTEST_SOURCE_DIR="$gtest_src" 2>&1 | tail -n 5
cmake --build "$build" -j "$(nproc)" --target core_tests step_bench 2>&1 | tail -n 3

status=0
"$build/tests/core_tests" --gtest_brief=1 2>&1 | tee "$out/core_tests.txt" || status=1
if grep -q "SKIPPED" "$out/core_tests.txt"; then
  echo "error: CUDA tests skipped on the GPU machine" | tee -a "$out/core_tests.txt"
  status=1
fi
# The issue's target: one worker's wide stage (4 x Linear 8192, batch 1024) against the
# cuBLAS GEMM rate in the same precision, measured in the same run.
wide="--device=cuda --stages=1 --layers=4 --width=8192 --input=8192 --batch=1024"
{
  "$build/bench/step_bench" $wide --precision=bf16
  "$build/bench/step_bench" $wide --precision=tf32
  "$build/bench/step_bench" $wide --precision=f32
  "$build/bench/step_bench" --device=cuda
  "$build/bench/step_bench" --device=cuda --rule=backprop
  "$build/bench/step_bench" --device=cpu
  # nanoGPT's shakespeare_char model at batch 64 and context 256, one stage, BACKPROP,
  # against cuBLAS on the step's own GEMMs (the attention's batched ones included).
  "$build/bench/step_bench" --device=cuda --model=gpt --batch=64 --context=256
  "$build/bench/step_bench" --device=cuda --model=gpt --batch=64 --context=256 --precision=bf16
} 2>&1 | tee "$out/bench.txt"
exit $status
