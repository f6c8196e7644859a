// Seeded dropout on the CPU; the mask is a pure function of (seed, index).
#include "common/core/cpu_backend.h"
#include "common/ops/activation_math.h"

namespace localpar {

void CpuBackend::DropoutForward(const float* x, float* y, float* mask, int64_t n, float p,
                                uint64_t seed) {
  for (int64_t i = 0; i < n; ++i) {
    mask[i] = DropoutScale(seed, i, p);
    y[i] = x[i] * mask[i];
  }
}

}  // namespace localpar
