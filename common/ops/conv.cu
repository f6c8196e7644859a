// NHWC convolution on CUDA: im2col, cuBLAS GEMM (ops/gemm) and the adjoint col2im.
#include "common/core/cuda_common.cuh"

namespace localpar {
namespace {

// One thread per col element.
__global__ void Im2ColKernel(const float* x, float* col, long long n, long long h, long long w,
                             long long c, long long kh, long long kw, long long stride,
                             long long pad, long long oh, long long ow) {
  long long row_len = kh * kw * c;
  LP_GRID_STRIDE(i, n * oh * ow * row_len) {
    long long ch = i % c;
    long long kx = (i / c) % kw;
    long long ky = (i / (c * kw)) % kh;
    long long pix = i / row_len;
    long long ox = pix % ow;
    long long oy = (pix / ow) % oh;
    long long b = pix / (ow * oh);
    long long iy = oy * stride - pad + ky, ix = ox * stride - pad + kx;
    col[i] = (iy < 0 || iy >= h || ix < 0 || ix >= w) ? 0.0f : x[((b * h + iy) * w + ix) * c + ch];
  }
}

// One thread per input element, gathering every col entry that maps to it: no atomics,
// so the sum order is fixed.
__global__ void Col2ImKernel(const float* col, float* dx, long long n, long long h, long long w,
                             long long c, long long kh, long long kw, long long stride,
                             long long pad, long long oh, long long ow) {
  long long row_len = kh * kw * c;
  LP_GRID_STRIDE(i, n * h * w * c) {
    long long ch = i % c;
    long long ix = (i / c) % w;
    long long iy = (i / (c * w)) % h;
    long long b = i / (c * w * h);
    float acc = 0.0f;
    for (long long ky = 0; ky < kh; ++ky) {
      long long ty = iy + pad - ky;
      if (ty < 0 || ty % stride) continue;
      long long oy = ty / stride;
      if (oy >= oh) continue;
      for (long long kx = 0; kx < kw; ++kx) {
        long long tx = ix + pad - kx;
        if (tx < 0 || tx % stride) continue;
        long long ox = tx / stride;
        if (ox >= ow) continue;
        acc += col[((b * oh + oy) * ow + ox) * row_len + (ky * kw + kx) * c + ch];
      }
    }
    dx[i] += acc;
  }
}

}  // namespace

void CudaBackend::Im2Col(const float* x, float* col, int64_t n, int64_t h, int64_t w, int64_t c,
                         int64_t kh, int64_t kw, int64_t stride, int64_t pad, int64_t oh,
                         int64_t ow) {
  Im2ColKernel<<<Blocks(n * oh * ow * kh * kw * c), kBlock, 0, StreamOf(this)>>>(
      x, col, n, h, w, c, kh, kw, stride, pad, oh, ow);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::Col2Im(const float* col, float* dx, int64_t n, int64_t h, int64_t w, int64_t c,
                         int64_t kh, int64_t kw, int64_t stride, int64_t pad, int64_t oh,
                         int64_t ow) {
  Col2ImKernel<<<Blocks(n * h * w * c), kBlock, 0, StreamOf(this)>>>(col, dx, n, h, w, c, kh, kw,
                                                                     stride, pad, oh, ow);
  LP_CUDA_LAUNCH_CHECK();
}

int64_t CudaBackend::ConvWorkspaceFloats(const ConvGeometry& g) {
  return ConvIm2ColWorkspaceFloats(g);
}

void CudaBackend::ConvForward(const ConvGeometry& g, const float* x, const float* w,
                              const float* bias, float* y, float* workspace) {
  ConvForwardIm2Col(g, x, w, bias, y, workspace);
}

void CudaBackend::ConvBackwardData(const ConvGeometry& g, const float* dy, const float* w,
                                   float* dx, float* workspace) {
  ConvBackwardDataIm2Col(g, dy, w, dx, workspace);
}

void CudaBackend::ConvBackwardWeights(const ConvGeometry& g, const float* x, const float* dy,
                                      float* dw, float* db, float* workspace) {
  ConvBackwardWeightsIm2Col(g, x, dy, dw, db, workspace);
}

}  // namespace localpar
