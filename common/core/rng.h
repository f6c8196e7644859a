// Counter-based random numbers: the same (seed, index) gives the same value on CPU and CUDA.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LP_HOST_DEVICE __host__ __device__
#else
#define LP_HOST_DEVICE
#endif

namespace localpar {

// SplitMix64 finaliser: a bijective 64-bit mixer, good enough for init and dropout masks.
LP_HOST_DEVICE inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

LP_HOST_DEVICE inline uint64_t HashCombine(uint64_t seed, uint64_t v) {
  return Mix64(seed ^ Mix64(v));
}

// Uniform in [0, 1) with 24 bits of mantissa, exact in float.
LP_HOST_DEVICE inline float UniformAt(uint64_t seed, uint64_t index) {
  return static_cast<float>(HashCombine(seed, index) >> 40) * (1.0f / 16777216.0f);
}

// A sequential stream for host-side uses (initialisation, shuffling).
class Rng {
 public:
  explicit Rng(uint64_t seed) : seed_(Mix64(seed)) {}
  uint64_t NextU64() { return HashCombine(seed_, counter_++); }
  float NextUniform() { return static_cast<float>(NextU64() >> 40) * (1.0f / 16777216.0f); }
  // Unbiased integer in [0, n) by rejection.
  uint64_t NextBelow(uint64_t n) {
    uint64_t limit = ~0ull - (~0ull % n);
    uint64_t r;
    do {
      r = NextU64();
    } while (r >= limit);
    return r % n;
  }

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
};

}  // namespace localpar
