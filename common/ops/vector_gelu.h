// GELU on the CPU without a call into libm, so that its loops vectorise; kept in a header so
// that tests can compute it one element at a time against the backend's vector loops.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "common/ops/activation_math.h"

namespace localpar {

// tanh without a call into libm, so that the GELU loops vectorise: tanh(u) = sign(u) (1 -
// 2 / (e^{2|u|} + 1)), with e^y from Cephes' expf (range reduction by ln 2 in two parts, a
// degree-5 polynomial, the power of two put in the exponent bits). Within 2.5e-7 of the
// exact tanh everywhere, which is all GELU needs (it uses 1 + tanh and 1 - tanh^2); libm's
// tanhf, one element at a time, was half of a transformer's training step.
inline float VectorTanh(float u) {
  const float y = std::min(2.0f * std::fabs(u), 40.0f);  // e^40 is still a finite float
  const int32_t n = static_cast<int32_t>(y * 1.44269504088896341f + 0.5f);  // y >= 0: floor
  const float nf = static_cast<float>(n);
  const float r = (y - nf * 0.693359375f) + nf * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = (p * r * r + r + 1.0f) * std::bit_cast<float>((n + 127) << 23);
  return std::copysign(1.0f - 2.0f / (e + 1.0f), u);
}

inline float CpuGeluValue(float x) {
  const float t = VectorTanh(kGeluC * (x + kGeluA * x * x * x));
  return 0.5f * x * (1.0f + t);
}

inline float CpuGeluDerivative(float x) {
  const float t = VectorTanh(kGeluC * (x + kGeluA * x * x * x));
  const float du = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

}  // namespace localpar
