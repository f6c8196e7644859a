// Seeded dropout on CUDA; draws the same mask as the CPU for the same seed.
#include "common/core/cuda_common.cuh"
#include "common/ops/activation_math.h"

namespace localpar {
namespace {

__global__ void DropoutKernel(const float* x, float* y, float* mask, long long n, float p,
                              uint64_t seed) {
  LP_GRID_STRIDE(i, n) {
    mask[i] = DropoutScale(seed, i, p);
    y[i] = x[i] * mask[i];
  }
}

}  // namespace

void CudaBackend::DropoutForward(const float* x, float* y, float* mask, int64_t n, float p,
                                 uint64_t seed) {
  DropoutKernel<<<Blocks(n), kBlock, 0, StreamOf(this)>>>(x, y, mask, n, p, seed);
  LP_CUDA_LAUNCH_CHECK();
}

}  // namespace localpar
