// Embedding lookup and its gradient, on CUDA.
#include "common/core/cuda_common.cuh"

namespace localpar {
namespace {

// The row an id selects, or -1 when the id is outside [0, vocab) (as on the CPU).
__device__ long long RowOf(int id, long long vocab) { return id >= 0 && id < vocab ? id : -1; }

__global__ void EmbeddingForwardKernel(const int32_t* ids, const float* table, float* out,
                                       long long n, long long dim, long long vocab) {
  LP_GRID_STRIDE(i, n * dim) {
    long long r = RowOf(ids[i / dim], vocab);
    out[i] = r < 0 ? 0.0f : table[r * dim + i % dim];
  }
}

// Atomic accumulation: repeated ids add in an unspecified order, so CUDA embedding
// gradients match the CPU within float tolerance, not bitwise.
__global__ void EmbeddingBackwardKernel(const int32_t* ids, const float* dout, float* dtable,
                                        long long n, long long dim, long long vocab) {
  LP_GRID_STRIDE(i, n * dim) {
    long long r = RowOf(ids[i / dim], vocab);
    if (r >= 0) atomicAdd(&dtable[r * dim + i % dim], dout[i]);
  }
}

}  // namespace

void CudaBackend::EmbeddingForward(const int32_t* ids, const float* table, float* out, int64_t n,
                                   int64_t dim, int64_t vocab) {
  if (n * dim == 0) return;
  EmbeddingForwardKernel<<<Blocks(n * dim), kBlock, 0, StreamOf(this)>>>(ids, table, out, n, dim,
                                                                         vocab);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::EmbeddingBackward(const int32_t* ids, const float* dout, float* dtable, int64_t n,
                                    int64_t dim, int64_t vocab) {
  if (n * dim == 0) return;
  EmbeddingBackwardKernel<<<Blocks(n * dim), kBlock, 0, StreamOf(this)>>>(ids, dout, dtable, n, dim,
                                                                          vocab);
  LP_CUDA_LAUNCH_CHECK();
}

}  // namespace localpar
