// Attention helpers on the CPU: head split/merge permutations and the causal softmax (of
// whole score matrices, and of their last rows for decoding with a key-value cache).
#include <cmath>
#include <cstring>

#include "common/core/cpu_backend.h"

namespace localpar {
namespace {

// Copies between [b, t, parts, heads, d] and [parts, b, heads, t, d]; `split` picks the
// direction.
void PermuteHeads(const float* src, float* dst, int64_t b, int64_t t, int64_t parts, int64_t heads,
                  int64_t d, bool split) {
  for (int64_t ib = 0; ib < b; ++ib) {
    for (int64_t it = 0; it < t; ++it) {
      for (int64_t p = 0; p < parts; ++p) {
        for (int64_t h = 0; h < heads; ++h) {
          int64_t packed = (((ib * t + it) * parts + p) * heads + h) * d;
          int64_t split_at = (((p * b + ib) * heads + h) * t + it) * d;
          if (split) {
            std::memcpy(dst + split_at, src + packed, sizeof(float) * d);
          } else {
            std::memcpy(dst + packed, src + split_at, sizeof(float) * d);
          }
        }
      }
    }
  }
}

}  // namespace

void CpuBackend::SplitHeads(const float* x, float* y, int64_t b, int64_t t, int64_t parts,
                            int64_t heads, int64_t d) {
  PermuteHeads(x, y, b, t, parts, heads, d, true);
}

void CpuBackend::MergeHeads(const float* y, float* x, int64_t b, int64_t t, int64_t parts,
                            int64_t heads, int64_t d) {
  PermuteHeads(y, x, b, t, parts, heads, d, false);
}

void CpuBackend::CausalSoftmaxForward(const float* s, float* p, int64_t mats, int64_t t,
                                      float scale) {
  CachedCausalSoftmaxForward(s, p, mats, t, t, scale);
}

void CpuBackend::CausalSoftmaxBackward(const float* p, const float* dp, float* ds, int64_t mats,
                                       int64_t t, float scale) {
  CachedCausalSoftmaxBackward(p, dp, ds, mats, t, t, scale);
}

void CpuBackend::CachedCausalSoftmaxForward(const float* s, float* p, int64_t mats, int64_t queries,
                                            int64_t t, float scale) {
  for (int64_t row = 0; row < mats * queries; ++row) {
    int64_t i = t - queries + row % queries;  // query position: keys 0..i are visible
    const float* sr = s + row * t;
    float* pr = p + row * t;
    float mx = sr[0] * scale;
    for (int64_t j = 1; j <= i; ++j) mx = std::fmax(mx, sr[j] * scale);
    float sum = 0.0f;
    for (int64_t j = 0; j <= i; ++j) {
      pr[j] = std::exp(sr[j] * scale - mx);
      sum += pr[j];
    }
    float inv = 1.0f / sum;
    for (int64_t j = 0; j <= i; ++j) pr[j] *= inv;
    for (int64_t j = i + 1; j < t; ++j) pr[j] = 0.0f;
  }
}

void CpuBackend::CachedCausalSoftmaxBackward(const float* p, const float* dp, float* ds,
                                             int64_t mats, int64_t queries, int64_t t,
                                             float scale) {
  for (int64_t row = 0; row < mats * queries; ++row) {
    const float* pr = p + row * t;
    const float* dpr = dp + row * t;
    float* dsr = ds + row * t;
    float dot = 0.0f;
    for (int64_t j = 0; j < t; ++j) dot += pr[j] * dpr[j];
    for (int64_t j = 0; j < t; ++j) dsr[j] = scale * pr[j] * (dpr[j] - dot);
  }
}

}  // namespace localpar
