// Batch norm over rows, per column, forward and backward, on the CPU. Column sums run
// row by row (vectorised over columns) and accumulate in double. The per-row loops are
// built for the machine's widest vectors (common/core/widest_vectors.h; this file is
// compiled with -ffp-contract=off): each column's lane does the scalar code's operations in
// its order, so every width gives the same bits.
#include <cmath>
#include <vector>

#include "common/core/cpu_backend.h"
#include "common/core/widest_vectors.h"

namespace localpar {
namespace {

// Each helper walks every row (rows x n, row-major) so that the width is picked once a call.
LP_WIDEST_VECTORS void AddRows(const float* __restrict x, double* __restrict sum, int64_t rows,
                               int64_t n) {
  for (int64_t r = 0; r < rows; ++r, x += n) {
    for (int64_t c = 0; c < n; ++c) sum[c] += x[c];
  }
}

LP_WIDEST_VECTORS void AddSquaredDeviations(const float* __restrict x, const float* __restrict mean,
                                            double* __restrict sq, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r, x += n) {
    for (int64_t c = 0; c < n; ++c) {
      double d = x[c] - mean[c];
      sq[c] += d * d;
    }
  }
}

LP_WIDEST_VECTORS void Normalize(const float* __restrict x, const float* __restrict mean,
                                 const float* __restrict rstd, const float* __restrict gamma,
                                 const float* __restrict beta, float* __restrict y, int64_t rows,
                                 int64_t n) {
  for (int64_t r = 0; r < rows; ++r, x += n, y += n) {
    for (int64_t c = 0; c < n; ++c) y[c] = (x[c] - mean[c]) * rstd[c] * gamma[c] + beta[c];
  }
}

LP_WIDEST_VECTORS void ScaleShift(const float* __restrict x, const float* __restrict scale,
                                  const float* __restrict shift, float* __restrict y, int64_t rows,
                                  int64_t n) {
  for (int64_t r = 0; r < rows; ++r, x += n, y += n) {
    for (int64_t c = 0; c < n; ++c) y[c] = x[c] * scale[c] + shift[c];
  }
}

LP_WIDEST_VECTORS void AddGradients(const float* __restrict dy, const float* __restrict x,
                                    const float* __restrict mean, const float* __restrict rstd,
                                    double* __restrict sg, double* __restrict sgx, int64_t rows,
                                    int64_t n) {
  for (int64_t r = 0; r < rows; ++r, x += n, dy += n) {
    for (int64_t c = 0; c < n; ++c) {
      float xhat = (x[c] - mean[c]) * rstd[c];
      sg[c] += dy[c];
      sgx[c] += static_cast<double>(dy[c]) * xhat;
    }
  }
}

LP_WIDEST_VECTORS void InputGradients(const float* __restrict dy, const float* __restrict x,
                                      const float* __restrict mean, const float* __restrict rstd,
                                      const float* __restrict k, const float* __restrict a,
                                      const float* __restrict b, float* __restrict dx, int64_t rows,
                                      int64_t n) {
  for (int64_t r = 0; r < rows; ++r, x += n, dy += n, dx += n) {
    for (int64_t c = 0; c < n; ++c) {
      float xhat = (x[c] - mean[c]) * rstd[c];
      dx[c] = k[c] * (dy[c] - a[c] - xhat * b[c]);
    }
  }
}

}  // namespace

void CpuBackend::BatchNormForward(const float* x, const float* gamma, const float* beta, float* y,
                                  float* mean, float* rstd, float* running_mean, float* running_var,
                                  int64_t rows, int64_t cols, float eps, float momentum,
                                  bool train) {
  const auto n = static_cast<size_t>(cols);
  if (!train) {
    std::vector<float> scale(n), shift(n);
    for (int64_t c = 0; c < cols; ++c) {
      float rs = 1.0f / std::sqrt(running_var[c] + eps);
      scale[c] = gamma[c] * rs;
      shift[c] = beta[c] - running_mean[c] * scale[c];
    }
    ScaleShift(x, scale.data(), shift.data(), y, rows, cols);
    return;
  }
  std::vector<double> sum(n, 0.0), sq(n, 0.0);
  AddRows(x, sum.data(), rows, cols);
  for (int64_t c = 0; c < cols; ++c) mean[c] = static_cast<float>(sum[c] / rows);
  AddSquaredDeviations(x, mean, sq.data(), rows, cols);
  for (int64_t c = 0; c < cols; ++c) {
    double var = sq[c] / rows;
    rstd[c] = static_cast<float>(1.0 / std::sqrt(var + eps));
    double unbiased = rows > 1 ? sq[c] / (rows - 1) : var;
    running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean[c];
    running_var[c] = (1.0f - momentum) * running_var[c] + momentum * static_cast<float>(unbiased);
  }
  Normalize(x, mean, rstd, gamma, beta, y, rows, cols);
}

void CpuBackend::BatchNormBackward(const float* dy, const float* x, const float* gamma,
                                   const float* mean, const float* rstd, float* dx, float* dgamma,
                                   float* dbeta, int64_t rows, int64_t cols) {
  const auto n = static_cast<size_t>(cols);
  std::vector<double> sg(n, 0.0), sgx(n, 0.0);
  AddGradients(dy, x, mean, rstd, sg.data(), sgx.data(), rows, cols);
  for (int64_t c = 0; c < cols; ++c) {
    dgamma[c] += static_cast<float>(sgx[c]);
    dbeta[c] += static_cast<float>(sg[c]);
  }
  if (!dx) return;
  // dx = gamma*rstd/N * (N*dy - sum(dy) - xhat*sum(dy*xhat))
  std::vector<float> a(n), b(n), k(n);
  for (int64_t c = 0; c < cols; ++c) {
    k[c] = gamma[c] * rstd[c];
    a[c] = static_cast<float>(sg[c] / rows);
    b[c] = static_cast<float>(sgx[c] / rows);
  }
  InputGradients(dy, x, mean, rstd, k.data(), a.data(), b.data(), dx, rows, cols);
}

}  // namespace localpar
