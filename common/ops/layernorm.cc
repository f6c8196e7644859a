// Layer norm over the last dimension, forward and backward, on the CPU.
#include <cmath>

#include "common/core/cpu_backend.h"

namespace localpar {

void CpuBackend::LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                                  float* mean, float* rstd, int64_t rows, int64_t cols, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float m = 0.0f;
    for (int64_t c = 0; c < cols; ++c) m += xr[c];
    m /= static_cast<float>(cols);
    float var = 0.0f;
    for (int64_t c = 0; c < cols; ++c) var += (xr[c] - m) * (xr[c] - m);
    var /= static_cast<float>(cols);
    float rs = 1.0f / std::sqrt(var + eps);
    mean[r] = m;
    rstd[r] = rs;
    float* yr = y + r * cols;
    for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - m) * rs * gamma[c] + beta[c];
  }
}

void CpuBackend::LayerNormBackward(const float* dy, const float* x, const float* gamma,
                                   const float* mean, const float* rstd, float* dx, float* dgamma,
                                   float* dbeta, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    float m = mean[r], rs = rstd[r];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      float xhat = (xr[c] - m) * rs;
      float g = dyr[c] * gamma[c];
      sum_g += g;
      sum_gx += g * xhat;
      dgamma[c] += dyr[c] * xhat;
      dbeta[c] += dyr[c];
    }
    if (!dx) continue;
    float inv_n = 1.0f / static_cast<float>(cols);
    float* dxr = dx + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      float xhat = (xr[c] - m) * rs;
      dxr[c] = rs * (dyr[c] * gamma[c] - inv_n * sum_g - xhat * inv_n * sum_gx);
    }
  }
}

}  // namespace localpar
