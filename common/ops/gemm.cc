// GEMM on the CPU: OpenBLAS sgemm, or a portable blocked loop where OpenBLAS is absent.
#include "common/core/cpu_backend.h"

#ifdef LOCALPAR_HAVE_OPENBLAS
#include <cblas.h>
#else
#include <algorithm>
#include <vector>
#endif

namespace localpar {

#ifndef LOCALPAR_HAVE_OPENBLAS
namespace {
// Used only on machines without OpenBLAS (the CUDA-only GPU build), where it serves as the
// CPU reference for parity tests; correctness over speed.
void PortableGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  const float* b, float beta, float* c) {
  std::vector<float> acc(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t p = 0; p < k; ++p) {
      float av = ta ? a[p * m + i] : a[i * k + p];
      if (tb) {
        for (int64_t j = 0; j < n; ++j) acc[j] += av * b[j * k + p];
      } else {
        const float* brow = b + p * n;
        for (int64_t j = 0; j < n; ++j) acc[j] += av * brow[j];
      }
    }
    float* crow = c + i * n;
    for (int64_t j = 0; j < n; ++j) {
      crow[j] = alpha * acc[j] + (beta == 0.0f ? 0.0f : beta * crow[j]);
    }
  }
}
}  // namespace
#endif

void CpuBackend::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
#ifdef LOCALPAR_HAVE_OPENBLAS
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(trans_a ? m : k), b,
              static_cast<blasint>(trans_b ? k : n), beta, c, static_cast<blasint>(n));
#else
  PortableGemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
#endif
}

void CpuBackend::GemmBatched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                             float alpha, const float* a, int64_t stride_a, const float* b,
                             int64_t stride_b, float beta, float* c, int64_t stride_c,
                             int64_t batch) {
  for (int64_t i = 0; i < batch; ++i) {
    Gemm(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, b + i * stride_b, beta,
         c + i * stride_c);
  }
}

}  // namespace localpar
