// SGD (momentum, weight decay) and AdamW parameter updates, on the CPU.
#include "common/core/cpu_backend.h"
#include "common/ops/optim_math.h"

namespace localpar {

void CpuBackend::SgdStep(float* p, float* g, float* velocity, int64_t n, float lr, float momentum,
                         float weight_decay, bool nesterov) {
  for (int64_t i = 0; i < n; ++i) {
    SgdUpdate(p[i], g[i], velocity[i], lr, momentum, weight_decay, nesterov);
    g[i] = 0.0f;
  }
}

void CpuBackend::AdamWStep(float* p, float* g, float* m, float* v, int64_t n, float lr, float beta1,
                           float beta2, float eps, float weight_decay, float c1, float c2) {
  for (int64_t i = 0; i < n; ++i) {
    AdamWUpdate(p[i], g[i], m[i], v[i], lr, beta1, beta2, eps, weight_decay, c1, c2);
    g[i] = 0.0f;
  }
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
