// SGD (momentum, weight decay) and AdamW parameter updates, on the CPU.
#include "common/core/cpu_backend.h"
#include "common/core/widest_vectors.h"
#include "common/ops/optim_math.h"

// The update loops are built for the widest vectors the machine has (widest_vectors.h; this
// file is compiled with -ffp-contract=off), so AVX-512 and AVX2 give the scalar loop's bits.

namespace localpar {
namespace {

LP_WIDEST_VECTORS void SgdLoop(float* p, float* g, float* velocity, int64_t n, float lr,
                               float momentum, float weight_decay, bool nesterov) {
  for (int64_t i = 0; i < n; ++i) {
    SgdUpdate(p[i], g[i], velocity[i], lr, momentum, weight_decay, nesterov);
    g[i] = 0.0f;
  }
}

LP_WIDEST_VECTORS void AdamWLoop(float* p, float* g, float* m, float* v, int64_t n, float lr,
                                 float beta1, float beta2, float eps, float weight_decay, float c1,
                                 float c2) {
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
