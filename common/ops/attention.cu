// Attention helpers on CUDA: head split/merge permutations and the causal softmax.
#include "common/core/cuda_common.cuh"

namespace localpar {
namespace {

// One thread per element of the packed [b, t, parts, heads, d] layout.
__global__ void PermuteHeadsKernel(const float* src, float* dst, long long b, long long t,
                                   long long parts, long long heads, long long d, bool split) {
  LP_GRID_STRIDE(i, b * t * parts * heads * d) {
    long long e = i % d;
    long long r = i / d;
    long long h = r % heads;
    r /= heads;
    long long p = r % parts;
    r /= parts;
    long long it = r % t;
    long long ib = r / t;
    long long split_at = (((p * b + ib) * heads + h) * t + it) * d + e;
    if (split) {
      dst[split_at] = src[i];
    } else {
      dst[i] = src[split_at];
    }
  }
}

// One block per row of one score matrix; the rows are the last `queries` of [t, t].
__global__ void CausalSoftmaxForwardKernel(const float* s, float* p, long long queries, long long t,
                                           float scale) {
  __shared__ float shm[kBlock];
  long long row = blockIdx.x;
  long long i = t - queries + row % queries;
  const float* sr = s + row * t;
  float* pr = p + row * t;
  float mx = -INFINITY;
  for (long long j = threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, sr[j] * scale);
  // Block max through the shared buffer.
  shm[threadIdx.x] = mx;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) shm[threadIdx.x] = fmaxf(shm[threadIdx.x], shm[threadIdx.x + w]);
    __syncthreads();
  }
  mx = shm[0];
  __syncthreads();
  float sum = 0.0f;
  for (long long j = threadIdx.x; j <= i; j += blockDim.x) sum += expf(sr[j] * scale - mx);
  float inv = 1.0f / BlockSum(sum, shm);
  for (long long j = threadIdx.x; j < t; j += blockDim.x) {
    pr[j] = j <= i ? expf(sr[j] * scale - mx) * inv : 0.0f;
  }
}

__global__ void CausalSoftmaxBackwardKernel(const float* p, const float* dp, float* ds, long long t,
                                            float scale) {
  __shared__ float shm[kBlock];
  long long row = blockIdx.x;
  const float* pr = p + row * t;
  const float* dpr = dp + row * t;
  float dot = 0.0f;
  for (long long j = threadIdx.x; j < t; j += blockDim.x) dot += pr[j] * dpr[j];
  dot = BlockSum(dot, shm);
  for (long long j = threadIdx.x; j < t; j += blockDim.x) {
    ds[row * t + j] = scale * pr[j] * (dpr[j] - dot);
  }
}

}  // namespace

void CudaBackend::SplitHeads(const float* x, float* y, int64_t b, int64_t t, int64_t parts,
                             int64_t heads, int64_t d) {
  PermuteHeadsKernel<<<Blocks(b * t * parts * heads * d), kBlock, 0, StreamOf(this)>>>(
      x, y, b, t, parts, heads, d, true);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::MergeHeads(const float* y, float* x, int64_t b, int64_t t, int64_t parts,
                             int64_t heads, int64_t d) {
  PermuteHeadsKernel<<<Blocks(b * t * parts * heads * d), kBlock, 0, StreamOf(this)>>>(
      y, x, b, t, parts, heads, d, false);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::CausalSoftmaxForward(const float* s, float* p, int64_t mats, int64_t t,
                                       float scale) {
  CachedCausalSoftmaxForward(s, p, mats, t, t, scale);
}

void CudaBackend::CausalSoftmaxBackward(const float* p, const float* dp, float* ds, int64_t mats,
                                        int64_t t, float scale) {
  CachedCausalSoftmaxBackward(p, dp, ds, mats, t, t, scale);
}

void CudaBackend::CachedCausalSoftmaxForward(const float* s, float* p, int64_t mats,
                                             int64_t queries, int64_t t, float scale) {
  if (mats * queries * t == 0) return;
  CausalSoftmaxForwardKernel<<<static_cast<unsigned>(mats * queries), kBlock, 0, StreamOf(this)>>>(
      s, p, queries, t, scale);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::CachedCausalSoftmaxBackward(const float* p, const float* dp, float* ds,
                                              int64_t mats, int64_t queries, int64_t t,
                                              float scale) {
  if (mats * queries * t == 0) return;
  CausalSoftmaxBackwardKernel<<<static_cast<unsigned>(mats * queries), kBlock, 0, StreamOf(this)>>>(
      p, dp, ds, t, scale);
  LP_CUDA_LAUNCH_CHECK();
}

}  // namespace localpar
