// Embedding lookup and its gradient, on CUDA.
#include "common/core/cuda_common.cuh"

namespace localpar {
namespace {

// The row an id selects, or -1 when the id is not an integer in [0, vocab) (as on the CPU).
__device__ long long RowOf(float id, long long vocab) {
  if (!(id >= 0.0f && id < static_cast<float>(vocab))) return -1;
  long long r = static_cast<long long>(id);
  return static_cast<float>(r) == id ? r : -1;
}

__global__ void EmbeddingForwardKernel(const float* ids, const float* table, float* out,
                                       long long n, long long dim, long long vocab) {
  LP_GRID_STRIDE(i, n * dim) {
    long long r = RowOf(ids[i / dim], vocab);
    out[i] = r < 0 ? 0.0f : table[r * dim + i % dim];
  }
}

// Atomic accumulation: repeated ids add in an unspecified order, so CUDA embedding
// gradients match the CPU within float tolerance, not bitwise.
__global__ void EmbeddingBackwardKernel(const float* ids, const float* dout, float* dtable,
                                        long long n, long long dim, long long vocab) {
  LP_GRID_STRIDE(i, n * dim) {
    long long r = RowOf(ids[i / dim], vocab);
    if (r >= 0) atomicAdd(&dtable[r * dim + i % dim], dout[i]);
  }
}

}  // namespace

void CudaBackend::EmbeddingForward(const float* ids, const float* table, float* out, int64_t n,
                                   int64_t dim, int64_t vocab) {
  if (n * dim == 0) return;
  EmbeddingForwardKernel<<<Blocks(n * dim), kBlock, 0, StreamOf(this)>>>(ids, table, out, n, dim,
                                                                         vocab);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::EmbeddingBackward(const float* ids, const float* dout, float* dtable, int64_t n,
                                    int64_t dim, int64_t vocab) {
  if (n * dim == 0) return;
  EmbeddingBackwardKernel<<<Blocks(n * dim), kBlock, 0, StreamOf(this)>>>(ids, dout, dtable, n, dim,
                                                                          vocab);
  LP_CUDA_LAUNCH_CHECK();
}

}  // namespace localpar
