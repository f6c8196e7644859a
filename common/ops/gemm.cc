// GEMM on the CPU: oneDNN's sgemm, else OpenBLAS's, else a portable loop where neither is
// built in.
#include <vector>

#include "common/core/cpu_backend.h"
#include "common/core/dtype.h"

#if defined(LOCALPAR_HAVE_DNNL)
#include "common/core/check.h"
#include "dnnl.h"
#elif defined(LOCALPAR_HAVE_OPENBLAS)
#include <cblas.h>
#else
#include <algorithm>
#endif

namespace localpar {

const char* GemmPrecisionName(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::kTF32:
      return "tf32";
    case GemmPrecision::kBF16:
      return "bf16";
    case GemmPrecision::kF32:
      break;
  }
  return "f32";
}

std::string Backend::GemmPrecisionSuffix() const {
  if (gemm_precision_ == GemmPrecision::kF32) return "";
  return std::string(", ") + GemmPrecisionName(gemm_precision_) + " GEMMs";
}

void Backend::GemmBiasInSteps(int64_t m, int64_t n, int64_t k, const float* x, const float* w,
                              const float* bias, float* y, bool relu) {
  Gemm(false, false, m, n, k, 1.0f, x, w, 0.0f, y);
  AddRowVector(y, bias, m, n);
  if (relu) ReluForward(y, y, m * n);
}

namespace {
// An operand as a reduced-precision GEMM sees it: a copy rounded to nearest even (the
// tensor cores' inputs), or the operand itself in float32 mode.
const float* RoundedOperand(GemmPrecision p, const float* x, int64_t n, std::vector<float>* copy) {
  if (p == GemmPrecision::kF32) return x;
  copy->resize(static_cast<size_t>(n));
  float* out = copy->data();
  if (p == GemmPrecision::kBF16) {
    for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(FloatToBf16(x[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = RoundToTf32(x[i]);
  }
  return out;
}
}  // namespace

#if !defined(LOCALPAR_HAVE_DNNL) && !defined(LOCALPAR_HAVE_OPENBLAS)
namespace {
// Used only on machines without oneDNN or OpenBLAS (the CUDA-only GPU build), where it serves as
// the CPU reference for parity tests; correctness over speed.
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
  thread_local std::vector<float> a_copy, b_copy;
  a = RoundedOperand(gemm_precision_, a, m * k, &a_copy);
  b = RoundedOperand(gemm_precision_, b, k * n, &b_copy);
#if defined(LOCALPAR_HAVE_DNNL)
  // oneDNN's sgemm over OpenBLAS 0.3.21's: 1.03-1.19x on every shape a fashion_mlp step
  // runs, single-threaded, on this machine's AVX-512 (docs/performance.md). Its work split,
  // and so its sums, follow the calling thread's OpenMP thread count, set here each time.
  UseOwnThreads();
  LP_CHECK(dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, trans_a ? m : k,
                      b, trans_b ? k : n, beta, c, n) == dnnl_success);
#elif defined(LOCALPAR_HAVE_OPENBLAS)
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(trans_a ? m : k), b,
              static_cast<blasint>(trans_b ? k : n), beta, c, static_cast<blasint>(n));
#else
  PortableGemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
#endif
}

void CpuBackend::GemmBias(int64_t m, int64_t n, int64_t k, const float* x, const float* w,
                          const float* bias, float* y, bool relu) {
  GemmBiasInSteps(m, n, k, x, w, bias, y, relu);
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
