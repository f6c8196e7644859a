// Layer norm over the last dimension, forward and backward, on CUDA.
#include "common/core/cuda_common.cuh"

namespace localpar {
namespace {

// One block per row.
__global__ void LayerNormForwardKernel(const float* x, const float* gamma, const float* beta,
                                       float* y, float* mean, float* rstd, long long cols,
                                       float eps) {
  __shared__ float shm[kBlock];
  long long r = blockIdx.x;
  const float* xr = x + r * cols;
  float s = 0.0f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
  float m = BlockSum(s, shm) / cols;
  float v = 0.0f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) v += (xr[c] - m) * (xr[c] - m);
  float rs = rsqrtf(BlockSum(v, shm) / cols + eps);
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    y[r * cols + c] = (xr[c] - m) * rs * gamma[c] + beta[c];
  }
}

__global__ void LayerNormDxKernel(const float* dy, const float* x, const float* gamma,
                                  const float* mean, const float* rstd, float* dx, long long cols) {
  __shared__ float shm[kBlock];
  long long r = blockIdx.x;
  float m = mean[r], rs = rstd[r];
  float sg = 0.0f, sgx = 0.0f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    float g = dy[r * cols + c] * gamma[c];
    sg += g;
    sgx += g * (x[r * cols + c] - m) * rs;
  }
  sg = BlockSum(sg, shm);
  sgx = BlockSum(sgx, shm);
  float inv_n = 1.0f / cols;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    float xhat = (x[r * cols + c] - m) * rs;
    dx[r * cols + c] = rs * (dy[r * cols + c] * gamma[c] - inv_n * sg - xhat * inv_n * sgx);
  }
}

// One thread per column: deterministic parameter gradients.
__global__ void LayerNormParamGradKernel(const float* dy, const float* x, const float* mean,
                                         const float* rstd, float* dgamma, float* dbeta,
                                         long long rows, long long cols) {
  long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float g = 0.0f, b = 0.0f;
  for (long long r = 0; r < rows; ++r) {
    float d = dy[r * cols + c];
    g += d * (x[r * cols + c] - mean[r]) * rstd[r];
    b += d;
  }
  dgamma[c] += g;
  dbeta[c] += b;
}

}  // namespace

void CudaBackend::LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                                   float* mean, float* rstd, int64_t rows, int64_t cols,
                                   float eps) {
  if (rows == 0) return;
  LayerNormForwardKernel<<<static_cast<unsigned>(rows), kBlock, 0, StreamOf(this)>>>(
      x, gamma, beta, y, mean, rstd, cols, eps);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::LayerNormBackward(const float* dy, const float* x, const float* gamma,
                                    const float* mean, const float* rstd, float* dx, float* dgamma,
                                    float* dbeta, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  if (dx) {
    LayerNormDxKernel<<<static_cast<unsigned>(rows), kBlock, 0, StreamOf(this)>>>(
        dy, x, gamma, mean, rstd, dx, cols);
    LP_CUDA_LAUNCH_CHECK();
  }
  LayerNormParamGradKernel<<<CeilDiv(cols, kBlock), kBlock, 0, StreamOf(this)>>>(
      dy, x, mean, rstd, dgamma, dbeta, rows, cols);
  LP_CUDA_LAUNCH_CHECK();
}

}  // namespace localpar
