// Elementwise kernels on CUDA: fill, axpy, add, mul, bias rows, column sums, bf16.
#include <cuda_bf16.h>

#include "common/core/cuda_common.cuh"

namespace localpar {
namespace {

__global__ void FillKernel(float* x, float v, long long n) { LP_GRID_STRIDE(i, n) x[i] = v; }
__global__ void AxpyKernel(float alpha, const float* x, float* y, long long n) {
  LP_GRID_STRIDE(i, n) y[i] += alpha * x[i];
}
__global__ void AddKernel(const float* a, const float* b, float* out, long long n) {
  LP_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}
__global__ void MulKernel(const float* a, const float* b, float* out, long long n) {
  LP_GRID_STRIDE(i, n) out[i] = a[i] * b[i];
}
__global__ void AddRowVectorKernel(float* y, const float* bias, long long rows, long long cols) {
  LP_GRID_STRIDE(i, rows * cols) y[i] += bias[i % cols];
}
// One thread per column, walking down the rows: coalesced across the warp and the sum
// order is fixed, so results are deterministic.
__global__ void SumRowsKernel(const float* dy, float* db, long long rows, long long cols) {
  long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float acc = 0.0f;
  for (long long r = 0; r < rows; ++r) acc += dy[r * cols + c];
  db[c] += acc;
}
__global__ void ToBf16Kernel(const float* x, uint16_t* y, long long n) {
  LP_GRID_STRIDE(i, n) {
    __nv_bfloat16 h = __float2bfloat16_rn(x[i]);
    y[i] = *reinterpret_cast<uint16_t*>(&h);
  }
}
__global__ void FromBf16Kernel(const uint16_t* x, float* y, long long n) {
  LP_GRID_STRIDE(i, n) y[i] = __uint_as_float(static_cast<unsigned>(x[i]) << 16);
}

}  // namespace

void CudaBackend::Fill(float* x, float value, int64_t n) {
  FillKernel<<<Blocks(n), kBlock, 0, StreamOf(this)>>>(x, value, n);
  LP_CUDA_LAUNCH_CHECK();
}
void CudaBackend::Axpy(float alpha, const float* x, float* y, int64_t n) {
  AxpyKernel<<<Blocks(n), kBlock, 0, StreamOf(this)>>>(alpha, x, y, n);
  LP_CUDA_LAUNCH_CHECK();
}
void CudaBackend::Add(const float* a, const float* b, float* out, int64_t n) {
  AddKernel<<<Blocks(n), kBlock, 0, StreamOf(this)>>>(a, b, out, n);
  LP_CUDA_LAUNCH_CHECK();
}
void CudaBackend::Mul(const float* a, const float* b, float* out, int64_t n) {
  MulKernel<<<Blocks(n), kBlock, 0, StreamOf(this)>>>(a, b, out, n);
  LP_CUDA_LAUNCH_CHECK();
}
void CudaBackend::AddRowVector(float* y, const float* bias, int64_t rows, int64_t cols) {
  AddRowVectorKernel<<<Blocks(rows * cols), kBlock, 0, StreamOf(this)>>>(y, bias, rows, cols);
  LP_CUDA_LAUNCH_CHECK();
}
void CudaBackend::SumRows(const float* dy, float* db, int64_t rows, int64_t cols) {
  SumRowsKernel<<<CeilDiv(cols, kBlock), kBlock, 0, StreamOf(this)>>>(dy, db, rows, cols);
  LP_CUDA_LAUNCH_CHECK();
}
void CudaBackend::ToBf16(const float* x, uint16_t* y, int64_t n) {
  ToBf16Kernel<<<Blocks(n), kBlock, 0, StreamOf(this)>>>(x, y, n);
  LP_CUDA_LAUNCH_CHECK();
}
void CudaBackend::FromBf16(const uint16_t* x, float* y, int64_t n) {
  FromBf16Kernel<<<Blocks(n), kBlock, 0, StreamOf(this)>>>(x, y, n);
  LP_CUDA_LAUNCH_CHECK();
}

}  // namespace localpar
