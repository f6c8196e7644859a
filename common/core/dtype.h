// Element types of tensors and the float32 <-> bfloat16 conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace localpar {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kI32 = 2 };

inline size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
      return 2;
  }
  return 0;
}

// Round-to-nearest-even; NaN stays NaN.
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Rounds to TensorFloat-32 (float32 with 10 mantissa bits), nearest even; NaN and Inf pass.
inline float RoundToTf32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return f;
  u += 0xfffu + ((u >> 13) & 1u);
  u &= 0xffffe000u;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float Bf16ToFloat(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even float32 -> IEEE half; overflow gives +-inf, NaN stays NaN, tiny
// values become half subnormals or zero.
inline uint16_t FloatToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // under half the smallest
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    int shift = 126 - static_cast<int>(abs >> 23);  // 14..24: to units of 2^-24
    uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias the exponent (127 -> 15), round the 13 dropped mantissa bits to even.
  uint32_t v = abs - 0x38000000u;
  v += 0xfffu + ((v >> 13) & 1u);
  return static_cast<uint16_t>(sign | (v >> 13));
}

inline float F16ToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (mant << 13);  // inf / NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else {  // subnormal: mant * 2^-24, exact in float
    float f = static_cast<float>(mant) * (1.0f / 16777216.0f);
    std::memcpy(&u, &f, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// How activations travel between workers. kF32 is exact; the 16-bit formats halve the bytes
// and round (to nearest even) once per hop.
enum class WireFormat : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

// What a value looks like after one trip over the wire in `format`.
inline void RoundThroughWire(WireFormat format, float* x, size_t n) {
  if (format == WireFormat::kBF16) {
    for (size_t i = 0; i < n; ++i) x[i] = Bf16ToFloat(FloatToBf16(x[i]));
  } else if (format == WireFormat::kF16) {
    for (size_t i = 0; i < n; ++i) x[i] = F16ToFloat(FloatToF16(x[i]));
  }
}

}  // namespace localpar
