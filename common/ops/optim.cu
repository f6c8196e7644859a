// SGD (momentum, weight decay) and AdamW parameter updates, on CUDA.
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

}  // namespace

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
