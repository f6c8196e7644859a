// SGD (momentum, weight decay) and AdamW parameter updates, on CUDA.
#include <algorithm>
#include <vector>

#include "common/core/cuda_common.cuh"
#include "common/ops/optim_math.h"

namespace localpar {
namespace {

__global__ void SgdKernel(float* p, float* g, float* vel, long long n, float lr, float momentum,
                          float wd, bool nesterov) {
  LP_GRID_STRIDE(i, n) {
    SgdUpdate(p[i], g[i], vel[i], lr, momentum, wd, nesterov);
    g[i] = 0.0f;
  }
}

__global__ void AdamWKernel(float* p, float* g, float* m, float* v, long long n, float lr, float b1,
                            float b2, float eps, float wd, float c1, float c2) {
  LP_GRID_STRIDE(i, n) {
    AdamWUpdate(p[i], g[i], m[i], v[i], lr, b1, b2, eps, wd, c1, c2);
    g[i] = 0.0f;
  }
}

// One block's partial sum of squares per block, in double.
__global__ void SquaresKernel(const float* x, long long n, double* partial) {
  __shared__ double shm[kBlock];
  double s = 0;
  LP_GRID_STRIDE(i, n) { s += static_cast<double>(x[i]) * x[i]; }
  s = BlockSum(s, shm);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void ScaleKernel(float* x, float s, long long n) {
  LP_GRID_STRIDE(i, n) { x[i] *= s; }
}

}  // namespace

double CudaBackend::SquaredNorm(const float* x, int64_t n) {
  if (n == 0) return 0;
  const unsigned blocks = std::min<unsigned>(Blocks(n), 1024);
  double* partial = static_cast<double*>(Allocate(blocks * sizeof(double)));
  SquaresKernel<<<blocks, kBlock, 0, StreamOf(this)>>>(x, n, partial);
  LP_CUDA_LAUNCH_CHECK();
  std::vector<double> host(blocks);
  CopyToHost(host.data(), partial, blocks * sizeof(double));
  Free(partial);
  double sum = 0;
  for (double v : host) sum += v;
  return sum;
}

void CudaBackend::Scale(float* x, float s, int64_t n) {
  ScaleKernel<<<Blocks(n), kBlock, 0, StreamOf(this)>>>(x, s, n);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::SgdStep(float* p, float* g, float* velocity, int64_t n, float lr, float momentum,
                          float weight_decay, bool nesterov) {
  SgdKernel<<<Blocks(n), kBlock, 0, StreamOf(this)>>>(p, g, velocity, n, lr, momentum, weight_decay,
                                                      nesterov);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::AdamWStep(float* p, float* g, float* m, float* v, int64_t n, float lr,
                            float beta1, float beta2, float eps, float weight_decay, float c1,
                            float c2) {
  AdamWKernel<<<Blocks(n), kBlock, 0, StreamOf(this)>>>(p, g, m, v, n, lr, beta1, beta2, eps,
                                                        weight_decay, c1, c2);
  LP_CUDA_LAUNCH_CHECK();
}

}  // namespace localpar
