// Max, average and global average pooling over NHWC tensors, on CUDA.
#include <cfloat>

#include "common/core/cuda_common.cuh"
#include "common/ops/pool_window.h"

namespace localpar {
namespace {

// Decomposes a flat NHWC index of the output (oh x ow) or input (h x w) grid.
struct Pix {
  long long b, y, x, ch;
};
__device__ inline Pix Unflatten(long long i, long long hh, long long ww, long long c) {
  return Pix{i / (c * ww * hh), (i / (c * ww)) % hh, (i / c) % ww, i % c};
}

__global__ void MaxPoolForwardKernel(const float* x, float* y, int32_t* argmax, long long n,
                                     long long h, long long w, long long c, long long k,
                                     long long stride, long long pad, long long oh, long long ow) {
  LP_GRID_STRIDE(o, n * oh * ow * c) {
    Pix p = Unflatten(o, oh, ow, c);
    float best = -FLT_MAX;
    int best_i = -1;
    ForEachInWindow(p.y, p.x, h, w, k, stride, pad, [&](int64_t iy, int64_t ix) {
      float v = x[((p.b * h + iy) * w + ix) * c + p.ch];
      if (best_i < 0 || v > best) {
        best = v;
        best_i = static_cast<int>(iy * w + ix);
      }
    });
    y[o] = best_i < 0 ? 0.0f : best;
    argmax[o] = best_i;
  }
}

// Gather form: each input element sums the windows whose arg-max it is.
__global__ void MaxPoolBackwardKernel(const float* dy, const int32_t* argmax, float* dx,
                                      long long n, long long h, long long w, long long c,
                                      long long k, long long stride, long long pad, long long oh,
                                      long long ow) {
  LP_GRID_STRIDE(i, n * h * w * c) {
    Pix p = Unflatten(i, h, w, c);
    int self = static_cast<int>(p.y * w + p.x);
    float acc = 0.0f;
    // Windows oy with oy*stride - pad <= y < oy*stride - pad + k.
    long long oy_lo = p.y + pad - k + 1 > 0 ? (p.y + pad - k + stride) / stride : 0;
    long long ox_lo = p.x + pad - k + 1 > 0 ? (p.x + pad - k + stride) / stride : 0;
    for (long long oy = oy_lo; oy < oh && oy * stride - pad <= p.y; ++oy) {
      for (long long ox = ox_lo; ox < ow && ox * stride - pad <= p.x; ++ox) {
        long long o = ((p.b * oh + oy) * ow + ox) * c + p.ch;
        if (argmax[o] == self) acc += dy[o];
      }
    }
    dx[i] = acc;
  }
}

__global__ void AvgPoolForwardKernel(const float* x, float* y, long long n, long long h,
                                     long long w, long long c, long long k, long long stride,
                                     long long pad, long long oh, long long ow) {
  LP_GRID_STRIDE(o, n * oh * ow * c) {
    Pix p = Unflatten(o, oh, ow, c);
    float s = 0.0f;
    ForEachInWindow(p.y, p.x, h, w, k, stride, pad,
                    [&](int64_t iy, int64_t ix) { s += x[((p.b * h + iy) * w + ix) * c + p.ch]; });
    y[o] = s / static_cast<float>(k * k);
  }
}

__global__ void AvgPoolBackwardKernel(const float* dy, float* dx, long long n, long long h,
                                      long long w, long long c, long long k, long long stride,
                                      long long pad, long long oh, long long ow) {
  LP_GRID_STRIDE(i, n * h * w * c) {
    Pix p = Unflatten(i, h, w, c);
    float acc = 0.0f;
    // Windows oy with oy*stride - pad <= y < oy*stride - pad + k.
    long long oy_lo = p.y + pad - k + 1 > 0 ? (p.y + pad - k + stride) / stride : 0;
    long long ox_lo = p.x + pad - k + 1 > 0 ? (p.x + pad - k + stride) / stride : 0;
    for (long long oy = oy_lo; oy < oh && oy * stride - pad <= p.y; ++oy) {
      for (long long ox = ox_lo; ox < ow && ox * stride - pad <= p.x; ++ox) {
        acc += dy[((p.b * oh + oy) * ow + ox) * c + p.ch];
      }
    }
    dx[i] = acc / static_cast<float>(k * k);
  }
}

__global__ void GlobalAvgPoolForwardKernel(const float* x, float* y, long long n, long long hw,
                                           long long c) {
  LP_GRID_STRIDE(o, n * c) {
    long long b = o / c, ch = o % c;
    float s = 0.0f;
    for (long long p = 0; p < hw; ++p) s += x[(b * hw + p) * c + ch];
    y[o] = s / static_cast<float>(hw);
  }
}

__global__ void GlobalAvgPoolBackwardKernel(const float* dy, float* dx, long long n, long long hw,
                                            long long c) {
  LP_GRID_STRIDE(i, n * hw * c) {
    long long b = i / (hw * c), ch = i % c;
    dx[i] = dy[b * c + ch] / static_cast<float>(hw);
  }
}

}  // namespace

void CudaBackend::MaxPoolForward(const float* x, float* y, int32_t* argmax, int64_t n, int64_t h,
                                 int64_t w, int64_t c, int64_t k, int64_t stride, int64_t pad,
                                 int64_t oh, int64_t ow) {
  MaxPoolForwardKernel<<<Blocks(n * oh * ow * c), kBlock, 0, StreamOf(this)>>>(
      x, y, argmax, n, h, w, c, k, stride, pad, oh, ow);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::MaxPoolBackward(const float* dy, const int32_t* argmax, float* dx, int64_t n,
                                  int64_t h, int64_t w, int64_t c, int64_t k, int64_t stride,
                                  int64_t pad, int64_t oh, int64_t ow) {
  MaxPoolBackwardKernel<<<Blocks(n * h * w * c), kBlock, 0, StreamOf(this)>>>(
      dy, argmax, dx, n, h, w, c, k, stride, pad, oh, ow);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::AvgPoolForward(const float* x, float* y, int64_t n, int64_t h, int64_t w,
                                 int64_t c, int64_t k, int64_t stride, int64_t pad, int64_t oh,
                                 int64_t ow) {
  AvgPoolForwardKernel<<<Blocks(n * oh * ow * c), kBlock, 0, StreamOf(this)>>>(x, y, n, h, w, c, k,
                                                                               stride, pad, oh, ow);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::AvgPoolBackward(const float* dy, float* dx, int64_t n, int64_t h, int64_t w,
                                  int64_t c, int64_t k, int64_t stride, int64_t pad, int64_t oh,
                                  int64_t ow) {
  AvgPoolBackwardKernel<<<Blocks(n * h * w * c), kBlock, 0, StreamOf(this)>>>(dy, dx, n, h, w, c, k,
                                                                              stride, pad, oh, ow);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::GlobalAvgPoolForward(const float* x, float* y, int64_t n, int64_t hw, int64_t c) {
  GlobalAvgPoolForwardKernel<<<Blocks(n * c), kBlock, 0, StreamOf(this)>>>(x, y, n, hw, c);
  LP_CUDA_LAUNCH_CHECK();
}

void CudaBackend::GlobalAvgPoolBackward(const float* dy, float* dx, int64_t n, int64_t hw,
                                        int64_t c) {
  GlobalAvgPoolBackwardKernel<<<Blocks(n * hw * c), kBlock, 0, StreamOf(this)>>>(dy, dx, n, hw, c);
  LP_CUDA_LAUNCH_CHECK();
}

}  // namespace localpar
