// Helpers shared by the CUDA kernels: checked calls, launch geometry, stream access.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "common/core/cuda_backend.h"

namespace localpar {

// CUDA failures inside the core are unrecoverable device faults, so they abort with
// the file and line rather than propagate.
#define LP_CUDA_CHECK(expr)                                                         \
  do {                                                                              \
    cudaError_t err_ = (expr);                                                      \
    if (err_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s:%d: CUDA error %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(err_));                                       \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

#define LP_CUBLAS_CHECK(expr)                                                                    \
  do {                                                                                           \
    cublasStatus_t st_ = (expr);                                                                 \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                          \
      std::fprintf(stderr, "%s:%d: cuBLAS error %d: %s\n", __FILE__, __LINE__, (int)st_, #expr); \
      std::abort();                                                                              \
    }                                                                                            \
  } while (0)

#define LP_CUDA_LAUNCH_CHECK() LP_CUDA_CHECK(cudaGetLastError())

constexpr int kBlock = 256;

inline unsigned CeilDiv(long long n, long long d) { return static_cast<unsigned>((n + d - 1) / d); }

// Grid for a 1-D grid-stride loop over n elements.
inline unsigned Blocks(long long n) {
  long long b = (n + kBlock - 1) / kBlock;
  if (b < 1) b = 1;
  if (b > 65535LL * 8) b = 65535LL * 8;
  return static_cast<unsigned>(b);
}

inline cudaStream_t StreamOf(const CudaBackend* b) {
  return static_cast<cudaStream_t>(b->stream());
}
// Frees the cuBLASLt plans (ops/gemm.cu); called by ~CudaBackend.
void DestroyLtPlans(CudaBackend* b);

inline cublasHandle_t CublasOf(const CudaBackend* b) {
  return static_cast<cublasHandle_t>(b->cublas());
}

// Block-wide sum through shared memory (shm holds blockDim.x values, a power of two).
// The tree order is fixed, so the result is deterministic.
template <typename T>
__device__ inline T BlockSum(T v, T* shm) {
  shm[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shm[threadIdx.x] += shm[threadIdx.x + s];
    __syncthreads();
  }
  T r = shm[0];
  __syncthreads();
  return r;
}

#define LP_GRID_STRIDE(i, n)                                                    \
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
       i += (long long)blockDim.x * gridDim.x)

}  // namespace localpar
