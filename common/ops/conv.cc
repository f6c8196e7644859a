// im2col and its adjoint for NHWC convolution, on the CPU (the GEMM is ops/gemm).
#include <cstring>

#include "common/core/cpu_backend.h"

namespace localpar {

void CpuBackend::Im2Col(const float* x, float* col, int64_t n, int64_t h, int64_t w, int64_t c,
                        int64_t kh, int64_t kw, int64_t stride, int64_t pad, int64_t oh,
                        int64_t ow) {
  const int64_t row_len = kh * kw * c;
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t oy = 0; oy < oh; ++oy) {
      for (int64_t ox = 0; ox < ow; ++ox) {
        float* dst = col + ((b * oh + oy) * ow + ox) * row_len;
        for (int64_t ky = 0; ky < kh; ++ky) {
          int64_t iy = oy * stride - pad + ky;
          for (int64_t kx = 0; kx < kw; ++kx) {
            int64_t ix = ox * stride - pad + kx;
            float* d = dst + (ky * kw + kx) * c;
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) {
              std::memset(d, 0, sizeof(float) * c);
            } else {
              std::memcpy(d, x + ((b * h + iy) * w + ix) * c, sizeof(float) * c);
            }
          }
        }
      }
    }
  }
}

void CpuBackend::Col2Im(const float* col, float* dx, int64_t n, int64_t h, int64_t w, int64_t c,
                        int64_t kh, int64_t kw, int64_t stride, int64_t pad, int64_t oh,
                        int64_t ow) {
  const int64_t row_len = kh * kw * c;
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t oy = 0; oy < oh; ++oy) {
      for (int64_t ox = 0; ox < ow; ++ox) {
        const float* src = col + ((b * oh + oy) * ow + ox) * row_len;
        for (int64_t ky = 0; ky < kh; ++ky) {
          int64_t iy = oy * stride - pad + ky;
          if (iy < 0 || iy >= h) continue;
          for (int64_t kx = 0; kx < kw; ++kx) {
            int64_t ix = ox * stride - pad + kx;
            if (ix < 0 || ix >= w) continue;
            const float* s = src + (ky * kw + kx) * c;
            float* d = dx + ((b * h + iy) * w + ix) * c;
            for (int64_t ch = 0; ch < c; ++ch) d[ch] += s[ch];
          }
        }
      }
    }
  }
}

}  // namespace localpar
