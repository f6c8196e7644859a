// Batch norm over rows, per column, forward and backward, on the CPU. Column sums run
// row by row (vectorised over columns) and accumulate in double.
#include <cmath>
#include <vector>

#include "common/core/cpu_backend.h"

namespace localpar {

void CpuBackend::BatchNormForward(const float* x, const float* gamma, const float* beta, float* y,
                                  float* mean, float* rstd, float* running_mean, float* running_var,
                                  int64_t rows, int64_t cols, float eps, float momentum,
                                  bool train) {
  if (!train) {
    for (int64_t c = 0; c < cols; ++c) {
      float rs = 1.0f / std::sqrt(running_var[c] + eps);
      float scale = gamma[c] * rs;
      float shift = beta[c] - running_mean[c] * scale;
      for (int64_t r = 0; r < rows; ++r) y[r * cols + c] = x[r * cols + c] * scale + shift;
    }
    return;
  }
  std::vector<double> sum(static_cast<size_t>(cols), 0.0), sq(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) sum[c] += xr[c];
  }
  for (int64_t c = 0; c < cols; ++c) mean[c] = static_cast<float>(sum[c] / rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      double d = xr[c] - mean[c];
      sq[c] += d * d;
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    double var = sq[c] / rows;
    rstd[c] = static_cast<float>(1.0 / std::sqrt(var + eps));
    double unbiased = rows > 1 ? sq[c] / (rows - 1) : var;
    running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean[c];
    running_var[c] = (1.0f - momentum) * running_var[c] + momentum * static_cast<float>(unbiased);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mean[c]) * rstd[c] * gamma[c] + beta[c];
  }
}

void CpuBackend::BatchNormBackward(const float* dy, const float* x, const float* gamma,
                                   const float* mean, const float* rstd, float* dx, float* dgamma,
                                   float* dbeta, int64_t rows, int64_t cols) {
  std::vector<double> sg(static_cast<size_t>(cols), 0.0), sgx(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      float xhat = (xr[c] - mean[c]) * rstd[c];
      sg[c] += dyr[c];
      sgx[c] += static_cast<double>(dyr[c]) * xhat;
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    dgamma[c] += static_cast<float>(sgx[c]);
    dbeta[c] += static_cast<float>(sg[c]);
  }
  if (!dx) return;
  // dx = gamma*rstd/N * (N*dy - sum(dy) - xhat*sum(dy*xhat))
  std::vector<float> a(static_cast<size_t>(cols)), b(static_cast<size_t>(cols)),
      k(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    k[c] = gamma[c] * rstd[c];
    a[c] = static_cast<float>(sg[c] / rows);
    b[c] = static_cast<float>(sgx[c] / rows);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    float* dxr = dx + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      float xhat = (xr[c] - mean[c]) * rstd[c];
      dxr[c] = k[c] * (dyr[c] - a[c] - xhat * b[c]);
    }
  }
}

}  // namespace localpar
