// SGD (momentum, weight decay) and AdamW parameter updates, on the CPU.
#include "common/core/cpu_backend.h"
#include "common/ops/optim_math.h"

// The update loops are built for the widest vectors the machine has (AVX-512, AVX2, or
// x86-64's SSE2), picked when the program loads. Each lane does the same IEEE operations in
// the same order as the scalar loop, so every build gives the same bits; this file is
// compiled with -ffp-contract=off so that no width fuses a multiply and an add (FMA would
// round once where the scalar code rounds twice).
#if defined(__x86_64__) && defined(__GNUC__)
#define LP_WIDEST_VECTORS __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LP_WIDEST_VECTORS
#endif

namespace localpar {
namespace {

LP_WIDEST_VECTORS void SgdLoop(float* __restrict p, float* __restrict g, float* __restrict velocity,
                               int64_t n, float lr, float momentum, float weight_decay,
                               bool nesterov) {
  for (int64_t i = 0; i < n; ++i) {
    SgdUpdate(p[i], g[i], velocity[i], lr, momentum, weight_decay, nesterov);
    g[i] = 0.0f;
  }
}

LP_WIDEST_VECTORS void AdamWLoop(float* __restrict p, float* __restrict g, float* __restrict m,
                                 float* __restrict v, int64_t n, float lr, float beta1, float beta2,
                                 float eps, float weight_decay, float c1, float c2) {
  for (int64_t i = 0; i < n; ++i) {
    AdamWUpdate(p[i], g[i], m[i], v[i], lr, beta1, beta2, eps, weight_decay, c1, c2);
    g[i] = 0.0f;
  }
}

}  // namespace

void CpuBackend::SgdStep(float* p, float* g, float* velocity, int64_t n, float lr, float momentum,
                         float weight_decay, bool nesterov) {
  SgdLoop(p, g, velocity, n, lr, momentum, weight_decay, nesterov);
}

void CpuBackend::AdamWStep(float* p, float* g, float* m, float* v, int64_t n, float lr, float beta1,
                           float beta2, float eps, float weight_decay, float c1, float c2) {
  AdamWLoop(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, c1, c2);
}

double CpuBackend::SquaredNorm(const float* x, int64_t n) {
  double sum = 0;  // one order, every run and every process alike
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

void CpuBackend::Scale(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace localpar
