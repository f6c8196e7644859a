// Embedding lookup and its gradient, on the CPU.
#include <cstring>

#include "common/core/cpu_backend.h"

namespace localpar {

void CpuBackend::EmbeddingForward(const int32_t* ids, const float* table, float* out, int64_t n,
                                  int64_t dim) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out + i * dim, table + static_cast<int64_t>(ids[i]) * dim, sizeof(float) * dim);
  }
}

void CpuBackend::EmbeddingBackward(const int32_t* ids, const float* dout, float* dtable, int64_t n,
                                   int64_t dim) {
  for (int64_t i = 0; i < n; ++i) {
    float* row = dtable + static_cast<int64_t>(ids[i]) * dim;
    const float* g = dout + i * dim;
    for (int64_t d = 0; d < dim; ++d) row[d] += g[d];
  }
}

}  // namespace localpar
