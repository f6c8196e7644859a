// The pooling window walk, shared by the CPU and CUDA pooling kernels.
#pragma once

#include <cstdint>

#include "common/core/rng.h"  // LP_HOST_DEVICE

namespace localpar {

// Calls f(iy, ix) for each in-bounds input pixel of the k x k window at output (oy, ox).
template <typename F>
LP_HOST_DEVICE inline void ForEachInWindow(int64_t oy, int64_t ox, int64_t h, int64_t w, int64_t k,
                                           int64_t stride, int64_t pad, F&& f) {
  for (int64_t ky = 0; ky < k; ++ky) {
    int64_t iy = oy * stride - pad + ky;
    if (iy < 0 || iy >= h) continue;
    for (int64_t kx = 0; kx < k; ++kx) {
      int64_t ix = ox * stride - pad + kx;
      if (ix < 0 || ix >= w) continue;
      f(iy, ix);
    }
  }
}

}  // namespace localpar
