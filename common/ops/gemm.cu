// GEMM on CUDA: every GEMM goes through this one cuBLAS call.
#include "common/core/cuda_common.cuh"

namespace localpar {

void CudaBackend::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  // cuBLAS is column-major: a row-major C = op(A) op(B) is the column-major
  // C^T = op(B)^T op(A)^T, so the operands swap places.
  LP_CUBLAS_CHECK(cublasSgemm(CublasOf(this), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                              static_cast<int>(m), static_cast<int>(k), &alpha, b,
                              static_cast<int>(trans_b ? k : n), a,
                              static_cast<int>(trans_a ? m : k), &beta, c, static_cast<int>(n)));
}

void CudaBackend::GemmBatched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                              float alpha, const float* a, int64_t stride_a, const float* b,
                              int64_t stride_b, float beta, float* c, int64_t stride_c,
                              int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  LP_CUBLAS_CHECK(cublasSgemmStridedBatched(
      CublasOf(this), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
      static_cast<int>(trans_b ? k : n), stride_b, a, static_cast<int>(trans_a ? m : k), stride_a,
      &beta, c, static_cast<int>(n), stride_c, static_cast<int>(batch)));
}

}  // namespace localpar
