// Batch norm over rows, per column, forward and backward, on CUDA. One block per column;
// sums in a fixed tree order (deterministic), partial sums in double like the CPU.
#include "common/core/cuda_common.cuh"

namespace localpar {
namespace {

__global__ void BatchNormStatsKernel(const float* x, float* mean, float* rstd, float* running_mean,
                                     float* running_var, long long rows, long long cols, float eps,
                                     float momentum) {
  __shared__ double shm[kBlock];
  long long c = blockIdx.x;
  double s = 0.0;
  for (long long r = threadIdx.x; r < rows; r += blockDim.x) s += x[r * cols + c];
  float m = static_cast<float>(BlockSum(s, shm) / rows);
  double q = 0.0;
  for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
    double d = x[r * cols + c] - m;
    q += d * d;
  }
  q = BlockSum(q, shm);
  if (threadIdx.x == 0) {
    double var = q / rows;
    mean[c] = m;
    rstd[c] = static_cast<float>(1.0 / sqrt(var + eps));
    double unbiased = rows > 1 ? q / (rows - 1) : var;
    running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * m;
    running_var[c] = (1.0f - momentum) * running_var[c] + momentum * static_cast<float>(unbiased);
  }
}

__global__ void BatchNormApplyKernel(const float* x, const float* gamma, const float* beta,
                                     float* y, const float* mean, const float* rstd,
                                     const float* running_mean, const float* running_var,
                                     long long rows, long long cols, float eps, bool train) {
  LP_GRID_STRIDE(i, rows * cols) {
    long long c = i % cols;
    float m = train ? mean[c] : running_mean[c];
    float rs = train ? rstd[c] : 1.0f / sqrtf(running_var[c] + eps);
    y[i] = (x[i] - m) * rs * gamma[c] + beta[c];
  }
}

__global__ void BatchNormGradSumsKernel(const float* dy, const float* x, const float* mean,
                                        const float* rstd, float* sums, float* dgamma, float* dbeta,
                                        long long rows, long long cols) {
  __shared__ double shm[kBlock];
  long long c = blockIdx.x;
  double sg = 0.0, sgx = 0.0;
  for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
    float d = dy[r * cols + c];
    float xhat = (x[r * cols + c] - mean[c]) * rstd[c];
    sg += d;
    sgx += static_cast<double>(d) * xhat;
  }
  sg = BlockSum(sg, shm);
  sgx = BlockSum(sgx, shm);
  if (threadIdx.x == 0) {
    dgamma[c] += static_cast<float>(sgx);
    dbeta[c] += static_cast<float>(sg);
    sums[c] = static_cast<float>(sg / rows);
    sums[cols + c] = static_cast<float>(sgx / rows);
  }
}

__global__ void BatchNormDxKernel(const float* dy, const float* x, const float* gamma,
                                  const float* mean, const float* rstd, const float* sums,
                                  float* dx, long long rows, long long cols) {
  LP_GRID_STRIDE(i, rows * cols) {
    long long c = i % cols;
    float xhat = (x[i] - mean[c]) * rstd[c];
    dx[i] = gamma[c] * rstd[c] * (dy[i] - sums[c] - xhat * sums[cols + c]);
  }
}

}  // namespace

void CudaBackend::BatchNormForward(const float* x, const float* gamma, const float* beta, float* y,
                                   float* mean, float* rstd, float* running_mean,
                                   float* running_var, int64_t rows, int64_t cols, float eps,
                                   float momentum, bool train) {
  if (rows == 0 || cols == 0) return;
  if (train) {
    BatchNormStatsKernel<<<static_cast<unsigned>(cols), kBlock, 0, StreamOf(this)>>>(
        x, mean, rstd, running_mean, running_var, rows, cols, eps, momentum);
    LP_CUDA_LAUNCH_CHECK();
  }
  BatchNormApplyKernel<<<Blocks(rows * cols), kBlock, 0, StreamOf(this)>>>(
      x, gamma, beta, y, mean, rstd, running_mean, running_var, rows, cols, eps, train);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::BatchNormBackward(const float* dy, const float* x, const float* gamma,
                                    const float* mean, const float* rstd, float* dx, float* dgamma,
                                    float* dbeta, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  float* sums = static_cast<float*>(Scratch(2 * cols * sizeof(float)));
  BatchNormGradSumsKernel<<<static_cast<unsigned>(cols), kBlock, 0, StreamOf(this)>>>(
      dy, x, mean, rstd, sums, dgamma, dbeta, rows, cols);
  LP_CUDA_LAUNCH_CHECK();
  if (!dx) return;
  BatchNormDxKernel<<<Blocks(rows * cols), kBlock, 0, StreamOf(this)>>>(dy, x, gamma, mean, rstd,
                                                                        sums, dx, rows, cols);
  LP_CUDA_LAUNCH_CHECK();
}

}  // namespace localpar
