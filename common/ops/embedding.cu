// Embedding lookup and its gradient, on CUDA.
#include "common/core/cuda_common.cuh"

namespace localpar {
namespace {

__global__ void EmbeddingForwardKernel(const int32_t* ids, const float* table, float* out,
                                       long long n, long long dim) {
  LP_GRID_STRIDE(i, n * dim) out[i] = table[static_cast<long long>(ids[i / dim]) * dim + i % dim];
}

// Atomic accumulation: repeated ids add in an unspecified order, so CUDA embedding
// gradients match the CPU within float tolerance, not bitwise.
__global__ void EmbeddingBackwardKernel(const int32_t* ids, const float* dout, float* dtable,
                                        long long n, long long dim) {
  LP_GRID_STRIDE(i, n * dim) {
    atomicAdd(&dtable[static_cast<long long>(ids[i / dim]) * dim + i % dim], dout[i]);
  }
}

}  // namespace

void CudaBackend::EmbeddingForward(const int32_t* ids, const float* table, float* out, int64_t n,
                                   int64_t dim) {
  EmbeddingForwardKernel<<<Blocks(n * dim), kBlock, 0, StreamOf(this)>>>(ids, table, out, n, dim);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::EmbeddingBackward(const int32_t* ids, const float* dout, float* dtable, int64_t n,
                                    int64_t dim) {
  EmbeddingBackwardKernel<<<Blocks(n * dim), kBlock, 0, StreamOf(this)>>>(ids, dout, dtable, n,
                                                                          dim);
  LP_CUDA_LAUNCH_CHECK();
}

}  // namespace localpar
