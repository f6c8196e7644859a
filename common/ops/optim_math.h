// Per-element optimizer updates, shared by the CPU and CUDA kernels so both apply the same
// arithmetic in the same order.
#pragma once

#include <cmath>

#include "common/core/rng.h"  // LP_HOST_DEVICE

namespace localpar {

LP_HOST_DEVICE inline void SgdUpdate(float& p, float g, float& vel, float lr, float momentum,
                                     float wd, bool nesterov) {
  float d = g + wd * p;
  if (momentum != 0.0f) {
    vel = momentum * vel + d;
    d = nesterov ? d + momentum * vel : vel;
  }
  p -= lr * d;
}

LP_HOST_DEVICE inline void AdamWUpdate(float& p, float g, float& m, float& v, float lr, float b1,
                                       float b2, float eps, float wd, float c1, float c2) {
  p -= lr * wd * p;
  m = b1 * m + (1.0f - b1) * g;
  v = b2 * v + (1.0f - b2) * g * g;
  float mhat = m / c1;
  float vhat = v / c2;
  p -= lr * mhat / (sqrtf(vhat) + eps);
}

}  // namespace localpar
