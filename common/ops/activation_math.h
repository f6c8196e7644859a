// Scalar math for the activation kernels, shared by the CPU and CUDA versions.
#pragma once

#include <cmath>

#include "common/core/rng.h"  // LP_HOST_DEVICE

namespace localpar {

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

LP_HOST_DEVICE inline float GeluValue(float x) {
  float t = tanhf(kGeluC * (x + kGeluA * x * x * x));
  return 0.5f * x * (1.0f + t);
}

LP_HOST_DEVICE inline float GeluDerivative(float x) {
  float u = kGeluC * (x + kGeluA * x * x * x);
  float t = tanhf(u);
  float du = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

LP_HOST_DEVICE inline float DropoutScale(uint64_t seed, long long i, float p) {
  return UniformAt(seed, static_cast<uint64_t>(i)) >= p ? 1.0f / (1.0f - p) : 0.0f;
}

}  // namespace localpar
