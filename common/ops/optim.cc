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

}  // namespace localpar
