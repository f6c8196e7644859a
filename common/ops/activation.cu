// ReLU and GELU, forward and backward, on CUDA.
#include "common/core/cuda_common.cuh"
#include "common/ops/activation_math.h"

namespace localpar {
namespace {

__global__ void ReluForwardKernel(const float* x, float* y, long long n) {
  LP_GRID_STRIDE(i, n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
__global__ void ReluBackwardKernel(const float* y, const float* dy, float* dx, long long n) {
  LP_GRID_STRIDE(i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}
__global__ void GeluForwardKernel(const float* x, float* y, long long n) {
  LP_GRID_STRIDE(i, n) y[i] = GeluValue(x[i]);
}
__global__ void GeluBackwardKernel(const float* x, const float* dy, float* dx, long long n) {
  LP_GRID_STRIDE(i, n) dx[i] = dy[i] * GeluDerivative(x[i]);
}

}  // namespace

void CudaBackend::ReluForward(const float* x, float* y, int64_t n) {
  ReluForwardKernel<<<Blocks(n), kBlock, 0, StreamOf(this)>>>(x, y, n);
  LP_CUDA_LAUNCH_CHECK();
}
void CudaBackend::ReluBackward(const float* y, const float* dy, float* dx, int64_t n) {
  ReluBackwardKernel<<<Blocks(n), kBlock, 0, StreamOf(this)>>>(y, dy, dx, n);
  LP_CUDA_LAUNCH_CHECK();
}
void CudaBackend::GeluForward(const float* x, float* y, int64_t n) {
  GeluForwardKernel<<<Blocks(n), kBlock, 0, StreamOf(this)>>>(x, y, n);
  LP_CUDA_LAUNCH_CHECK();
}
void CudaBackend::GeluBackward(const float* x, const float* dy, float* dx, int64_t n) {
  GeluBackwardKernel<<<Blocks(n), kBlock, 0, StreamOf(this)>>>(x, dy, dx, n);
  LP_CUDA_LAUNCH_CHECK();
}

}  // namespace localpar
