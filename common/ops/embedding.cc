// Embedding lookup and its gradient, on the CPU.
#include <cstring>

#include "common/core/cpu_backend.h"

namespace localpar {
namespace {

// The row an id selects, or -1 when the id is outside [0, vocab).
int64_t RowOf(int32_t id, int64_t vocab) { return id >= 0 && id < vocab ? id : -1; }

}  // namespace

void CpuBackend::EmbeddingForward(const int32_t* ids, const float* table, float* out, int64_t n,
                                  int64_t dim, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = RowOf(ids[i], vocab);
    if (r < 0) {
      std::memset(out + i * dim, 0, sizeof(float) * dim);
    } else {
      std::memcpy(out + i * dim, table + r * dim, sizeof(float) * dim);
    }
  }
}

void CpuBackend::EmbeddingBackward(const int32_t* ids, const float* dout, float* dtable, int64_t n,
                                   int64_t dim, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = RowOf(ids[i], vocab);
    if (r < 0) continue;
    float* row = dtable + r * dim;
    const float* g = dout + i * dim;
    for (int64_t d = 0; d < dim; ++d) row[d] += g[d];
  }
}

}  // namespace localpar
