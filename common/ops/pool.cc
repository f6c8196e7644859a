// Max, average and global average pooling over NHWC tensors, on the CPU.

#include "common/core/cpu_backend.h"
#include "common/core/widest_vectors.h"
#include "common/ops/pool_window.h"

namespace localpar {

namespace {

// One window pixel against the running maxima: a strict comparison, so the first of equal
// maxima wins (and a NaN taken first stays), as in the CUDA kernel.
inline void TakeLarger(const float* __restrict v, int32_t at, float* __restrict best,
                       int32_t* __restrict best_i, int64_t c) {
  for (int64_t ch = 0; ch < c; ++ch) {
    const bool take = v[ch] > best[ch];
    best[ch] = take ? v[ch] : best[ch];
    best_i[ch] = take ? at : best_i[ch];
  }
}

// Channels innermost: the window's pixels in the same order as the CUDA kernel, the first
// one taken as it is, each later one by a vectorised loop over channels. A window wholly in
// the padding gives 0 and no argmax.
LP_WIDEST_VECTORS void MaxPoolAll(const float* x, float* y, int32_t* argmax, int64_t n, int64_t h,
                                  int64_t w, int64_t c, int64_t k, int64_t stride, int64_t pad,
                                  int64_t oh, int64_t ow) {
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t oy = 0; oy < oh; ++oy) {
      for (int64_t ox = 0; ox < ow; ++ox) {
        const int64_t o = ((b * oh + oy) * ow + ox) * c;
        float* best = y + o;
        int32_t* best_i = argmax + o;
        bool first = true;
        ForEachInWindow(oy, ox, h, w, k, stride, pad, [&](int64_t iy, int64_t ix) {
          const float* v = x + ((b * h + iy) * w + ix) * c;
          const auto at = static_cast<int32_t>(iy * w + ix);
          if (first) {
            for (int64_t ch = 0; ch < c; ++ch) best[ch] = v[ch];
            for (int64_t ch = 0; ch < c; ++ch) best_i[ch] = at;
            first = false;
          } else {
            TakeLarger(v, at, best, best_i, c);
          }
        });
        if (first) {
          for (int64_t ch = 0; ch < c; ++ch) best[ch] = 0.0f;
          for (int64_t ch = 0; ch < c; ++ch) best_i[ch] = -1;
        }
      }
    }
  }
}

}  // namespace

void CpuBackend::MaxPoolForward(const float* x, float* y, int32_t* argmax, int64_t n, int64_t h,
                                int64_t w, int64_t c, int64_t k, int64_t stride, int64_t pad,
                                int64_t oh, int64_t ow) {
  MaxPoolAll(x, y, argmax, n, h, w, c, k, stride, pad, oh, ow);
}

void CpuBackend::MaxPoolBackward(const float* dy, const int32_t* argmax, float* dx, int64_t n,
                                 int64_t h, int64_t w, int64_t c, int64_t /*k*/, int64_t /*stride*/,
                                 int64_t /*pad*/, int64_t oh, int64_t ow) {
  for (int64_t i = 0; i < n * h * w * c; ++i) dx[i] = 0.0f;
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t p = 0; p < oh * ow; ++p) {
      for (int64_t ch = 0; ch < c; ++ch) {
        int64_t o = (b * oh * ow + p) * c + ch;
        if (argmax[o] >= 0) dx[(b * h * w + argmax[o]) * c + ch] += dy[o];
      }
    }
  }
}

void CpuBackend::AvgPoolForward(const float* x, float* y, int64_t n, int64_t h, int64_t w,
                                int64_t c, int64_t k, int64_t stride, int64_t pad, int64_t oh,
                                int64_t ow) {
  const float inv = 1.0f / static_cast<float>(k * k);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t oy = 0; oy < oh; ++oy) {
      for (int64_t ox = 0; ox < ow; ++ox) {
        for (int64_t ch = 0; ch < c; ++ch) {
          float s = 0.0f;
          ForEachInWindow(oy, ox, h, w, k, stride, pad, [&](int64_t iy, int64_t ix) {
            s += x[((b * h + iy) * w + ix) * c + ch];
          });
          y[((b * oh + oy) * ow + ox) * c + ch] = s * inv;
        }
      }
    }
  }
}

void CpuBackend::AvgPoolBackward(const float* dy, float* dx, int64_t n, int64_t h, int64_t w,
                                 int64_t c, int64_t k, int64_t stride, int64_t pad, int64_t oh,
                                 int64_t ow) {
  const float inv = 1.0f / static_cast<float>(k * k);
  for (int64_t i = 0; i < n * h * w * c; ++i) dx[i] = 0.0f;
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t oy = 0; oy < oh; ++oy) {
      for (int64_t ox = 0; ox < ow; ++ox) {
        const float* g = dy + ((b * oh + oy) * ow + ox) * c;
        ForEachInWindow(oy, ox, h, w, k, stride, pad, [&](int64_t iy, int64_t ix) {
          float* d = dx + ((b * h + iy) * w + ix) * c;
          for (int64_t ch = 0; ch < c; ++ch) d[ch] += g[ch] * inv;
        });
      }
    }
  }
}

void CpuBackend::GlobalAvgPoolForward(const float* x, float* y, int64_t n, int64_t hw, int64_t c) {
  const float inv = 1.0f / static_cast<float>(hw);
  for (int64_t b = 0; b < n; ++b) {
    float* yb = y + b * c;
    for (int64_t ch = 0; ch < c; ++ch) yb[ch] = 0.0f;
    for (int64_t p = 0; p < hw; ++p) {
      const float* xp = x + (b * hw + p) * c;
      for (int64_t ch = 0; ch < c; ++ch) yb[ch] += xp[ch];
    }
    for (int64_t ch = 0; ch < c; ++ch) yb[ch] *= inv;
  }
}

void CpuBackend::GlobalAvgPoolBackward(const float* dy, float* dx, int64_t n, int64_t hw,
                                       int64_t c) {
  const float inv = 1.0f / static_cast<float>(hw);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t p = 0; p < hw; ++p) {
      float* d = dx + (b * hw + p) * c;
      for (int64_t ch = 0; ch < c; ++ch) d[ch] = dy[b * c + ch] * inv;
    }
  }
}

}  // namespace localpar
